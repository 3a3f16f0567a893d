#!/usr/bin/env bash
# A demo town: an embedded NATS server and the four services, some beads filed, worked and closed.
# Everything happens through the `gt` CLI an operator uses; the town is stopped at the end.
set -euo pipefail

export GT_HOME="${GT_HOME:-$(mktemp -d -t gastown-demo-XXXXXX)/town}"
unset NATS_URL  # the demo runs its own embedded NATS server
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$'; printf ' %q' "$@"; printf '\n'; "$@"; }

step "gt up: embedded NATS (JetStream, fsync on every write) + mayor, witness, refinery, deacon"
run gt up -d --port 0
trap 'step "gt down"; gt down' EXIT

step "file beads: one depends on another"
design=$(gt bead create "Design the frobulator" -p 1 -l demo -d "Sketch the API first")
echo "$design"
build=$(gt bead create "Build the frobulator" -l demo --needs "$design")
echo "$build"
docs=$(gt bead create "Document the frobulator" -t docs -l demo --needs "$build")
echo "$docs"

step "what is ready to work on (only the design: the others are blocked)"
run gt ready

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
