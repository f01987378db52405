#!/usr/bin/env bash
# llm.c's run-script loop: runs the training command until <out_dir>/DONE_<last step> exists.
# The command must carry -y 1, so each start after a crash, kill or lost node continues from the
# last complete checkpoint (and the first one, with nothing to resume, starts fresh).
#
#   scripts/resume_loop.sh OUT_DIR LAST_STEP COMMAND...
#
# MAX_STARTS (default 100) ends a loop whose trainer keeps failing, e.g. on a bad flag.
set -u
out_dir=$1 last_step=$2
shift 2
done_file=$(printf "%s/DONE_%08d" "$out_dir" "$last_step")
max_starts=${MAX_STARTS:-100}
starts=0
while true; do
    # exit condition: the optimization has finished
    if [ -f "$done_file" ]; then
        echo "File $done_file exists. Exiting the loop."
        break
    fi
    if [ "$starts" -ge "$max_starts" ]; then
        echo "error: the trainer started $starts times without writing $done_file; giving up" >&2
        exit 1
    fi
    starts=$((starts + 1))
    "$@"
    sleep 1
done
