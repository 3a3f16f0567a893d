#!/bin/sh
# Run inside a polecat's tmux pane by its agent command when agents run as their own OS user (GT_AGENT_USER), with
# exactly the session's environment: what an agent of the town's own user could do (read the town's secrets, write
# the rig's repository and clone by path, signal the services, drive other panes on the witness's tmux server),
# tried again. Writes what each got to $1 (one line each); judged from outside
# (tests/integration/test_agent_user.py). Usage: sh user_pane.sh REPORT ORIGIN
report="$1"
origin="$2"
: > "$report"
note() { printf '%s\t%s\n' "$1" "$2" >> "$report"; }
tried() { if "$@" >/dev/null 2>&1; then echo succeeded; else echo refused; fi; }

note whoami "$(id -un)"
note read-operator-password "$(tried cat "$GT_HOME/secrets/nats/operator.password")"
note read-admin-password "$(tried cat "$GT_HOME/secrets/nats/admin.password")"
note read-issuer-seed "$(tried cat "$GT_HOME/secrets/auth-issuer.seed")"
note read-session-key "$(tried cat "$GT_HOME/secrets/session.key")"
note list-secrets "$(tried ls "$GT_HOME/secrets")"
note list-town "$(tried ls "$GT_HOME")"
# The rig's repository by its path (the workspace's origin has no push URL; the path is there all the same).
echo backdoor > BACKDOOR.txt
git add BACKDOOR.txt && git commit -qm "ungated change straight to main"
note push-main-by-path "$(tried git push "$origin" HEAD:refs/heads/main)"
note plant-origin-hook "$(tried sh -c "echo 'env' > '$origin/hooks/pre-receive'")"
git reset -q --hard HEAD~1
# What it may do there: read it, to rebase its work onto the newest base.
note fetch-origin "$(tried git fetch -q origin)"
# The witness's clone of the rig, whose objects the workspace borrows: readable, not writable.
clone="$GT_HOME/rigs/$GT_RIG/repo.git"
note write-clone-config "$(tried sh -c "echo '[core] hooksPath = /tmp' >> '$clone/config'")"
note write-clone-ref "$(tried sh -c "echo 0 > '$clone/refs/heads/main'")"
# The services: signals refused (another user's processes).
pids="$(pgrep -f 'services\.(witness|mayor|refinery|deacon)' | tr '\n' ' ')"
note service-pids "$pids"
killed=refused
for pid in $pids; do kill -9 "$pid" 2>/dev/null && killed=succeeded; done
note kill-services "$killed"
# The witness's tmux server: every pane of the town on it.
socket="${TMUX_TMPDIR:-/tmp}/tmux-0/$GT_TMUX_SOCKET"
note tmux-list "$(tried tmux -S "$socket" list-sessions)"
note tmux-send-keys "$(tried tmux -S "$socket" send-keys -t "$GT_SESSION" 'echo pwned' Enter)"
note done all
