#!/usr/bin/env bash
# llm.c's run-script loop: runs the training command until <out_dir>/DONE_<last step> exists.
# The command must carry -y 1, so each start after a crash, kill or lost node continues from the
# last complete checkpoint (and the first one, with nothing to resume, starts fresh).
#
#   scripts/resume_loop.sh OUT_DIR LAST_STEP COMMAND...
#
# Two exits end the loop at once, with the trainer's code: 2, a usage error (a bad flag fails the
# same way every time), and 3, a run stopped on non-finite losses or gradient norms (a restart
# from the same checkpoint diverges again; its line says what is kept). MAX_STARTS (default 100)
# ends a loop whose trainer keeps failing otherwise.
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
    code=$?
    case $code in
        2) echo "error: the trainer exited 2 (a usage error, see its line above); not restarting it" >&2
           exit 2 ;;
        3) echo "error: the trainer exited 3 (stopped on non-finite losses or gradient norms, see its line above); not restarting it" >&2
           exit 3 ;;
    esac
    sleep 1
done
