#!/usr/bin/env bash
# qrl-verify through the binary: JSON output for each task, exit statuses, --help.
set -u
bin=${BUILD:-build}/bin/qrl-verify
[ -x "$bin" ] || { echo "no $bin (run make)"; exit 77; }
fails=0

# expect TASK REFERENCE RESPONSE WANT_JSON
expect() {
  local out rc
  out=$(printf '%s' "$3" | "$bin" --task "$1" --reference "$2"); rc=$?
  if [ $rc -ne 0 ] || [ "$out" != "$4" ]; then
    echo "FAIL --task $1 --reference '$2' <<< '$3'"; echo "  got (rc $rc): $out"; echo "  want: $4"
    fails=$((fails + 1))
  else
    echo "ok   $1: $out"
  fi
}

expect gsm8k 18 $'She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18' \
  '{"reward": 1.0, "correct": true, "found": true, "extracted": "18"}'
expect gsm8k 1000 'In total 1,000 dollars.' \
  '{"reward": 1.0, "correct": true, "found": true, "extracted": "1,000"}'
expect math 0.5 'Thus $\boxed{\frac{1}{2}}$.' \
  '{"reward": 1.0, "correct": true, "found": true, "extracted": "\\frac{1}{2}"}'
expect boxed 0.5 'Thus \boxed{2} no, \boxed{\dfrac{1}{2}}' \
  '{"reward": 1.0, "correct": true, "found": true, "extracted": "\\dfrac{1}{2}"}'
expect math 42 'The answer is 42.' \
  '{"reward": 0.0, "correct": false, "found": false, "extracted": ""}'
expect arith 1023 $'345 + 678 = 1023\nAnswer: 1023' \
  '{"reward": 1.0, "correct": true, "found": true, "extracted": "1023"}'
expect arith 1023 'Answer: 1024' \
  '{"reward": 0.0, "correct": false, "found": true, "extracted": "1024"}'
expect countdown '{"numbers":[25,5,4,3],"target":77}' '<answer>(25-5)*4-3</answer>' \
  '{"reward": 1.0, "correct": true, "found": true, "extracted": "(25-5)*4-3"}'
expect countdown '{"numbers":[25,5,4,3],"target":77}' '<answer>25/(5-5)+4+3</answer>' \
  '{"reward": 0.0, "correct": false, "found": true, "extracted": "25/(5-5)+4+3"}'

# --format-reward shapes a found-but-wrong answer
out=$(printf '\\boxed{7}' | "$bin" --task math --reference 8 --format-reward 0.25)
[ "$out" = '{"reward": 0.25, "correct": false, "found": true, "extracted": "7"}' ] \
  || { echo "FAIL format reward: $out"; fails=$((fails + 1)); }

# invalid UTF-8 in the answer still gives valid JSON
out=$(printf '\\boxed{\xff5}' | "$bin" --task math --reference 5)
[ "$out" = $'{"reward": 0.0, "correct": false, "found": true, "extracted": "\xef\xbf\xbd5"}' ] \
  || { echo "FAIL lossy UTF-8 (want U+FFFD then 5): $out"; fails=$((fails + 1)); }

# unknown task: a usage error, exit 1 (as every qrl program), one error line listing the known tasks
err=$(echo x | "$bin" --task nope --reference 1 2>&1 >/dev/null); rc=$?
if [ $rc -ne 1 ] || [[ $err != "qrl-verify: error: "* ]] || [[ "$err" != *"unknown task 'nope'"*"gsm8k, math, boxed, arith, countdown"* ]]; then
  echo "FAIL unknown task: rc $rc: $err"; fails=$((fails + 1))
fi
# malformed reference: exit 1, the field named
err=$(echo '<answer>1</answer>' | "$bin" --task countdown --reference '{"target":1}' 2>&1 >/dev/null); rc=$?
if [ $rc -ne 1 ] || [[ "$err" != *'"numbers"'* ]]; then
  echo "FAIL bad reference: rc $rc: $err"; fails=$((fails + 1))
fi
# usage errors: exit 1
echo x | "$bin" --task math >/dev/null 2>&1; [ $? -eq 1 ] || { echo "FAIL missing --reference"; fails=$((fails + 1)); }
echo x | "$bin" --bogus >/dev/null 2>&1; [ $? -eq 1 ] || { echo "FAIL unknown option"; fails=$((fails + 1)); }
echo x | "$bin" --task math --reference 1 --format-reward 2 >/dev/null 2>&1; [ $? -eq 1 ] \
  || { echo "FAIL format reward range"; fails=$((fails + 1)); }
help=$("$bin" --help); rc=$?
if [ $rc -ne 0 ] || [[ "$help" != *"--task"* ]] || [[ "$help" != *"countdown"* ]]; then
  echo "FAIL --help (rc $rc)"; fails=$((fails + 1))
fi

# writing the result to a full device is a failure, not a silent success
if [ -w /dev/full ]; then
  tmp_err=$(mktemp)
  printf '#### 42' | "$bin" --task gsm8k --reference 42 >/dev/full 2>"$tmp_err"; rc=$?
  if [ $rc -eq 1 ] && grep -q 'writing the result to stdout failed' "$tmp_err"; then echo "ok /dev/full"
  else echo "FAIL /dev/full (rc $rc: $(cat "$tmp_err"))"; fails=$((fails + 1)); fi
  rm -f "$tmp_err"
fi

echo "$fails failures"
[ $fails -eq 0 ]
