#!/usr/bin/env bash
# Fetch the Apache Kafka broker jars from Maven Central into DEST/libs.
#   deploy/kafka/fetch.sh DEST          (deploy/setup.sh calls it with <repo>/.deps/kafka)
#
# The jars are the dependency tree of deploy/kafka/pom.xml, copied with
# `mvn dependency:copy-dependencies`; Maven's local repository is DEST/m2, so nothing
# depends on (or lands in) ~/.m2.  Idempotent: when DEST/libs/.stamp holds the pom's
# sha256 and the broker jar is there, nothing is fetched.  Then a throwaway broker is
# started once to write DEST/cds/*.jsa (see kafka.sh warm).  Needs mvn and java (17+).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf 'setup: kafka: %s\n' "$*"; }
die() { printf 'setup: kafka: error: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
dest=$1
pom="$here/pom.xml"
libs="$dest/libs"
hash=$(sha256sum "$pom" | cut -d' ' -f1)
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")

# The JVM class-data archive halves broker start-up; making it takes one throwaway
# broker start and stop (kafka.sh warm; a no-op when the archive exists).
warm() {
  QRL_KAFKA_HOME=$dest "$here/kafka.sh" warm 2>&1 | sed 's/^kafka: /setup: kafka: /' ||
    say "warning: the warm-up broker failed (see above); brokers will start without the archive"
}

if [ -f "$libs/.stamp" ] && [ "$(cat "$libs/.stamp")" = "$hash" ] &&
   ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1; then
  say "Kafka $version jars already in $libs ($(ls "$libs"/*.jar | wc -l) jars)"
  warm
  exit 0
fi

command -v mvn >/dev/null || die "mvn not found (Debian package 'maven')"
command -v java >/dev/null || die "java not found (Debian package 'openjdk-17-jre-headless')"

say "fetching Kafka $version (kafka_2.13, kafka-tools, log4j2 binding) from Maven Central into $libs"
mkdir -p "$dest"
tmp="$dest/libs.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
# -B: no colour codes in logs; -q: only errors.  Re-run without -q on failure so the
# reason (network, missing artifact) is shown.
mvn_args=(-B -f "$pom" -Dmaven.repo.local="$dest/m2" dependency:copy-dependencies
          -DoutputDirectory="$tmp" -DincludeScope=runtime)
if ! mvn -q "${mvn_args[@]}" >/dev/null 2>&1; then
  mvn "${mvn_args[@]}" >&2 || true
  die "mvn dependency:copy-dependencies failed for $pom"
fi
ls "$tmp"/kafka_2.13-"$version".jar >/dev/null 2>&1 || die "kafka_2.13-$version.jar missing after the fetch"
echo "$hash" >"$tmp/.stamp"
rm -rf "$libs"
mv "$tmp" "$libs"
trap - EXIT
say "installed $(ls "$libs"/*.jar | wc -l) jars ($(du -sh "$libs" | cut -f1)) into $libs:"
(cd "$libs" && echo *.jar) | fold -s -w 96 | sed 's/^/setup: kafka:   /'
warm
