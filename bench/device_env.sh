# Sourced by the bench/run-*-gpu.sh scripts on the GPU machine: unpack the carried Debian
# libraries (../shared/tools/device-deps.sh -> .device-deps) once per set of packages (the
# carried set may have grown since /opt/qrl-deps was unpacked: unpack again then) and put
# their tools first on PATH; source the carried Java + Kafka (.device-kafka) when present.
if [ -f .device-deps/env.sh ]; then
  _qrl_stamp=$(ls .device-deps/*.deb | sha1sum | cut -c1-12)
  [ "$(cat /opt/qrl-deps/.stamp 2>/dev/null)" = "$_qrl_stamp" ] || rm -f /opt/qrl-deps/.done
  source .device-deps/env.sh
  echo "$_qrl_stamp" > /opt/qrl-deps/.stamp
  export PATH=/opt/qrl-deps/usr/bin:$PATH
fi
[ -f .device-kafka/env.sh ] && source .device-kafka/env.sh
true
