#!/bin/sh
# A hostile agent that tries to outlive its session: run as a polecat's agent command, it starts a writer detached
# from its session (setsid, then a double fork, SIGTERM/SIGHUP/SIGINT ignored) that appends to a file in the
# worktree every 0.2 s, forever; then its session dies. MODE keep-reaper: the agent just exits. MODE kill-reaper:
# it first kills its pane's reaper (shared/host/reaper.py; possible only where the reaper runs as the agent's own user),
# then hangs on, ignoring SIGHUP; where it cannot (GT_AGENT_USER: the reaper is root's) it exits. Judged from outside
# (tests/integration/test_leftover_processes.py): the writer is gone before the next session of the bead gets the
# worktree, and nothing is written after.
# Usage: sh detach_pane.sh attack MODE MARK   (a later attempt of the bead just waits; what became of the kill
# of the reaper goes to /tmp/MARK.reaper)
set -u
case "$1" in
writer)
    trap '' TERM HUP INT
    while :; do
        printf '%s\n' "${GT_SESSION:-?}" >> "$GT_WORKTREE/HOSTILE.txt"
        sleep 0.2
    done
    ;;
fork)
    # The second fork: the writer's parent exits at once, so the writer is re-parented (to a subreaper, or init).
    sh "$0" writer "$2" </dev/null >/dev/null 2>&1 &
    exit 0
    ;;
attack)
    mode="$2"
    mark="$3"
    if [ "${GT_ATTEMPT:-1}" != 1 ]; then
        exec sleep 600
    fi
    setsid sh "$0" fork "$mark" </dev/null >/dev/null 2>&1 &
    while [ ! -s "$GT_WORKTREE/HOSTILE.txt" ]; do sleep 0.1; done
    if [ "$mode" = kill-reaper ]; then
        trap '' HUP TERM  # the pane goes with its reaper: hang on all the same
        pid=$$
        while [ "$pid" -gt 1 ]; do
            if tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q 'reaper\.py'; then
                if ! kill -9 "$pid"; then
                    echo "could not kill my reaper $pid" > "/tmp/$mark.reaper"
                    exit 1
                fi
                echo "killed my reaper $pid" > "/tmp/$mark.reaper"
                break
            fi
            pid="$(awk '{ print $4 }' "/proc/$pid/stat")"
        done
        exec sleep 600
    fi
    exit 1
    ;;
esac
