#!/usr/bin/env bash
# A demo town: an embedded NATS server and the four services, some beads filed, worked and closed.
# Everything happens through the `gt` CLI an operator uses; the town is stopped at the end.
set -euo pipefail

export GT_HOME="${GT_HOME:-$(mktemp -d -t gastown-demo-XXXXXX)/town}"
unset NATS_URL  # the demo runs its own embedded NATS server
# Polecats run on a tmux server of the demo's own: `tmux -L $GT_TMUX_SOCKET attach` to watch one.
export GT_TMUX_SOCKET="${GT_TMUX_SOCKET:-gastown-demo-$$}"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$'; printf ' %q' "$@"; printf '\n'; "$@"; }

step "gt up: embedded NATS (JetStream, fsync on every write) + mayor, witness, refinery, deacon"
run gt up -d --port 0
trap 'step "gt down"; gt down; tmux -L "$GT_TMUX_SOCKET" kill-server 2>/dev/null || true' EXIT

step "file beads: one depends on another"
design=$(gt bead create "Design the frobulator" -p 1 -l demo -d "Sketch the API first")
echo "$design"
build=$(gt bead create "Build the frobulator" -l demo --needs "$design")
echo "$build"
docs=$(gt bead create "Document the frobulator" -t docs -l demo --needs "$build")
echo "$docs"

step "what is ready to work on (only the design: the others are blocked)"
run gt ready

step "a project for polecats: a git repository whose tests pass unless FAIL_TESTS exists"
origin="$(dirname "$GT_HOME")/frobulator.git"
src="$(dirname "$GT_HOME")/frobulator-src"
git init --quiet -b main "$src"
echo "the frobulator" > "$src/README.md"
git -C "$src" add README.md
git -C "$src" -c user.name=demo -c user.email=demo@localhost commit --quiet -m "init"
git clone --quiet --bare "$src" "$origin"

step "rig demo: the reference agent, told to crash (kill -9 itself) at step 3 of its first attempt"
run gt rig add demo "$origin" --test "test ! -e FAIL_TESTS" --agent "GT_AGENT_FAULT=crash-at-step=3@1 gt-agent"

step "park the rig: slings to it wait, no polecat starts (we work the design by hand)"
run gt rig park demo --reason "the design is done by hand"

step "sling the design to rig demo: it gets the polecat-work molecule and an auto-convoy"
run gt sling "$design" demo
run gt mol status "$design"

step "an agent works the steps; each one is checkpointed in the log"
for s in load-context implement commit; do run gt step done "$design" "$s"; done
run gt mol status "$design"

step "forward only: a done step is never redone (exit code 1)"
run gt step start "$design" implement || echo "(exit $?)"

step "finish the molecule and close the bead; its convoy closes by itself"
for s in self-review run-tests submit; do gt step done "$design" "$s" > /dev/null; done
run gt bead close "$design" --reason "API agreed"
run gt convoy list --all

step "the build is ready now"
run gt ready

step "unpark the rig and sling the build to it: the witness starts a polecat in tmux and a git worktree"
run gt rig unpark demo
run gt sling "$build" demo
for _ in $(seq 1 240); do
  if gt bead show "$build" --json | grep -q '"status": *"closed"'; then break; fi
  sleep 0.5
done

step "the first session died at step 3; a fresh one resumed at step 3; the refinery merged its branch"
run gt session list --bead "$build" --all
run gt mol status "$build"
run gt mq list --rig demo
run git --git-dir "$origin" log --format='%h %s' main
run gt bead show "$build"

step "forward only: a closed bead cannot be claimed again (exit code 1)"
run gt bead claim "$design" --assignee polecat:demo/bob || echo "(exit $?)"

step "mail and escalations"
run gt mail send mayor --subject "Release?" --body "Can the frobulator ship on Friday?" --actor operator:ann
run gt mail inbox mayor
run gt escalate "CI runners are slow" --severity medium --source operator:ann
run gt escalations

step "all beads, closed ones included"
run gt bead list --all

step "the design's history, straight from the event log"
run gt bead history "$design"

step "health of every service"
for service in mayor witness refinery deacon; do run gt health "$service"; done

echo
echo "Town home: $GT_HOME (logs in $GT_HOME/logs)"
