#!/usr/bin/env bash
# A demo town: an embedded NATS server and the four services, some beads filed, worked and closed: one by the
# reference agent (gt-agent, which crashes once and recovers), and two side by side in one rig by real agent CLIs,
# Claude Code (the rig's runtime) and Codex CLI (slung with --agent codex), driven by a scripted model server on a
# loopback port (no vendor API is called). Everything happens through the `gt` CLI an operator
# uses; the town and the model server are stopped at the end.
set -euo pipefail

# Its files go to a directory of its own, removed at the end whether the demo worked or not (GT_DEMO_KEEP=1 keeps
# it); a GT_HOME given is yours and kept.
own_dir=""
if [ -z "${GT_HOME:-}" ]; then
  own_dir="$(mktemp -d -t gastown-demo-XXXXXX)"
  export GT_HOME="$own_dir/town"
fi
unset NATS_URL  # the demo runs its own embedded NATS server
# Polecats run on a tmux server of the demo's own: `tmux -L $GT_TMUX_SOCKET attach` to watch one.
export GT_TMUX_SOCKET="${GT_TMUX_SOCKET:-gastown-demo-$$}"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$'; printf ' %q' "$@"; printf '\n'; "$@"; }
demo_dir="$(dirname "$GT_HOME")"
mkdir -p "$demo_dir"
model_server=""
stop_all() {
  local status=$?
  step "gt down"
  gt down || true
  tmux -L "$GT_TMUX_SOCKET" kill-server 2>/dev/null || true
  # tmux (3.3) leaves its socket file behind when its server ends.
  rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$GT_TMUX_SOCKET"
  if [ -n "$model_server" ]; then
    kill "$model_server" 2>/dev/null || true
    wait "$model_server" 2>/dev/null || true
  fi
  if [ "$status" -ne 0 ]; then
    echo "demo: failed (exit $status); the last lines of each log follow" >&2
    for log in "$GT_HOME"/logs/*.log "$demo_dir"/model-server.log; do
      [ -s "$log" ] || continue
      echo "--- $log" >&2; tail -n 15 "$log" >&2
    done
  fi
  if [ -n "$own_dir" ] && [ -z "${GT_DEMO_KEEP:-}" ]; then
    rm -rf "$own_dir"
  elif [ -n "$own_dir" ]; then
    echo "demo: kept its files in $own_dir (GT_DEMO_KEEP)"
  fi
}
trap stop_all EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# Claude Code's rig and the polecat the witness names first in it (ace): the scripted model's story writes files
# in that worktree by absolute path, as Claude Code's Write and Edit tools take them.
claude_rig=docs
claude_worktree="$GT_HOME/rigs/$claude_rig/polecats/ace"
# Each runtime's sessions get their story by the key they send (Claude Code Anthropic's, Codex CLI OpenAI's); the keys
# are dummies the model server accepts, nothing reaches a vendor.
claude_key="sk-ant-demo-scripted-model-server-not-a-real-key-0123456789"
codex_key="sk-demo-scripted-model-server-codex"
step "a scripted model server on a loopback port: Anthropic's and OpenAI's APIs, answering from scripts"
python -m gt.model_server.demo_story "$claude_worktree" > "$demo_dir/model-scripts.json"
python -m gt.model_server "$demo_dir/model-scripts.json" --key "$claude_key=demo-polecat" --key "$codex_key=demo-codex" \
  > "$demo_dir/model-server.out" 2> "$demo_dir/model-server.log" &
model_server=$!
for _ in $(seq 1 300); do [ -s "$demo_dir/model-server.out" ] && break; sleep 0.1; done
if [ ! -s "$demo_dir/model-server.out" ]; then
  echo "demo: the model server did not start:" >&2; cat "$demo_dir/model-server.log" >&2; exit 1
fi
base_url="$(python -c 'import json, sys; print(json.loads(sys.stdin.readline())["base_url"])' \
  < "$demo_dir/model-server.out")"
echo "serving at $base_url (its script: $demo_dir/model-scripts.json)"
# The witness passes each runtime's settings from its environment to its sessions (the vendors' variables): gt up
# starts the services with this shell's environment.
export ANTHROPIC_BASE_URL="$base_url" ANTHROPIC_API_KEY="$claude_key" ANTHROPIC_MODEL="claude-scripted-demo"
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1
export OPENAI_BASE_URL="$base_url/v1" OPENAI_API_KEY="$codex_key"
# The pinned CLIs `./dev setup` installed (not whatever `claude` or `codex` may be on PATH).
export GT_CLAUDE_BIN="${GT_CLAUDE_BIN:-$PWD/.tools/npm/node_modules/.bin/claude}"
export GT_CODEX_BIN="${GT_CODEX_BIN:-$PWD/.tools/npm/node_modules/.bin/codex}"

step "gt up: embedded NATS (JetStream, fsync on every write) + mayor, witness, refinery, deacon"
run gt up -d --port 0

step "file beads: the build and the docs depend on the design"
design=$(gt bead create "Design the frobulator" -p 1 -l demo -d "Sketch the API first")
echo "$design"
build=$(gt bead create "Build the frobulator" -l demo --needs "$design")
echo "$build"
docs=$(gt bead create "Document the frobulator" -t docs -l demo --needs "$design")
echo "$docs"
changelog=$(gt bead create "Start the frobulator's changelog" -t docs -l demo --needs "$design")
echo "$changelog"

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

step "rig $claude_rig, the same project: Claude Code polecats (the witness writes each one's config home and hooks)"
run gt rig add "$claude_rig" "$origin" --test "test ! -e FAIL_TESTS" --agent claude --stall-after 3600

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

step "the build, the docs and the changelog are ready now"
run gt ready

step "sling the docs to rig $claude_rig: Claude Code starts in tmux, driven by the scripted model"
run gt sling "$docs" "$claude_rig"

step "sling the changelog to the same rig with --agent codex: Codex CLI works it beside Claude Code"
run gt sling "$changelog" "$claude_rig" --agent codex

step "unpark rig demo and sling the build to it: the witness starts a gt-agent polecat in tmux and a git worktree"
run gt rig unpark demo
run gt sling "$build" demo
closed() { gt bead show "$1" --json | grep -q '"status": *"closed"'; }
claude_pane=""
for _ in $(seq 1 2000); do
  # Keep the Claude Code pane's last screen: the witness ends the pane once the session is done and its turn has
  # ended, within moments of its last words (so it is looked at often).
  if screen="$(tmux -L "$GT_TMUX_SOCKET" capture-pane -p -t "gt-$claude_rig-ace" 2>/dev/null)" && [ -n "$screen" ]; then
    claude_pane="$screen"
  fi
  # Claude Code stays at its prompt after `gt done`: the witness ends its pane (GT_DONE_EXIT_GRACE, 10 s).
  if closed "$build" && closed "$docs" && closed "$changelog" \
    && ! tmux -L "$GT_TMUX_SOCKET" has-session -t "=gt-$claude_rig-ace" 2>/dev/null
  then break; fi
  sleep 0.1
done

step "the first session died at step 3; a fresh one resumed at step 3; the refinery merged its branch"
run gt session list --bead "$build" --all
run gt mol status "$build"
run gt mq list --rig demo
run git --git-dir "$origin" log --format='%h %s' main
run gt bead show "$build"

step "Claude Code's session: primed by its SessionStart hook, it wrote and edited USAGE.md, committed, did every step"
run gt session list --bead "$docs" --all
run gt mol status "$docs"
run git --git-dir "$origin" show main:USAGE.md
# What the witness recorded of its pane when it ended it (`gt session show`); the demo's own last look at the
# pane is the fallback (recorded moments after the pane goes: waited for a little).
claude_session="$(gt session list --bead "$docs" --all --json | python -c 'import json, sys; print(json.load(sys.stdin)[-1]["id"])')"
for _ in $(seq 1 50); do
  recorded="$(gt session show "$claude_session" --json | python -c 'import json, sys; print(json.load(sys.stdin).get("pane_tail") or "")')"
  if [ -n "$recorded" ]; then claude_pane="$recorded"; break; fi
  sleep 0.2
done
echo "the last lines of its tmux pane, gt-$claude_rig-ace:"
# Its non-empty lines, right borders and padding trimmed, at most 100 characters wide (UTF-8: not cut's bytes).
printf '%s\n' "$claude_pane" | python -c '
import sys
lines = [line.rstrip().rstrip("\u2502").rstrip()[:100] for line in sys.stdin.buffer.read().decode(errors="replace").splitlines()]
print("\n".join("  | " + line for line in [line for line in lines if line][-24:]))'
if grep -q model_server_script_failure "$demo_dir/model-server.log"; then
  echo "the session strayed from the model's script:" >&2; grep model_server_script_failure "$demo_dir/model-server.log" >&2
fi
run gt bead show "$docs"

step "Codex CLI's session, in the same rig: its own config home and hooks, the same steps, its usage read for gt costs"
run gt session list --bead "$changelog" --all
run git --git-dir "$origin" show main:CHANGELOG.md
run gt costs --by session
if ! closed "$docs" || ! closed "$build" || ! closed "$changelog"; then
  echo "demo: a bead did not merge in time (the logs follow; GT_DEMO_KEEP=1 keeps them in $demo_dir)" >&2
  exit 1
fi

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
if [ -n "$own_dir" ] && [ -z "${GT_DEMO_KEEP:-}" ]; then
  echo "Town home: $GT_HOME, removed with the rest of $own_dir when the demo ends (GT_DEMO_KEEP=1 keeps it)"
else
  echo "Town home: $GT_HOME (logs in $GT_HOME/logs)"
fi
