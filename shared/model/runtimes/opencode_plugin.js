// gastown's hooks for OpenCode, written by the witness into this session's config dir (docs/agents.md, "Agent
// runtimes"). They give the marks Claude Code's hooks give, through the same `gt agent-hook`: started
// (session-start, whose answer, `gt prime`, is added to every request's system prompt), activity (a file touched
// after every tool call and every retry of a refused request), turn done (stop: an answer is the reason to go on,
// sent as the next prompt), turn failed (stop-failure: the model API's error). Every assistant message's usage is
// appended to a file the witness reads for `gt costs`. Plain JavaScript, no imports but node's: OpenCode would
// npm-install its plugin package for a plugin that needs it (offline, it hangs).
import { spawn } from "node:child_process"
import { appendFileSync, writeFileSync } from "node:fs"

const GT = __GT__
const HOOK_TIMEOUT_MS = __HOOK_TIMEOUT_MS__
const DIR = process.env.GT_SESSION_DIR
const ACTIVITY = DIR + "/__ACTIVITY__"
const USAGE = DIR + "/__USAGE__"

function hook(event, input) {
  return new Promise((resolve) => {
    let out = ""
    const child = spawn(GT, ["agent-hook", "--runtime", "opencode", event], { stdio: ["pipe", "pipe", "ignore"] })
    const timer = setTimeout(() => child.kill("SIGKILL"), HOOK_TIMEOUT_MS)
    child.stdout.on("data", (chunk) => (out += chunk))
    child.on("error", () => resolve(""))
    child.on("close", () => {
      clearTimeout(timer)
      resolve(out.trim())
    })
    child.stdin.on("error", () => {})
    child.stdin.end(JSON.stringify(input))
  })
}

function touch(path) {
  try {
    writeFileSync(path, "")
  } catch {}
}

export const Gastown = async ({ client }) => {
  // The session the pane's prompt started; a subagent's sessions come later and are left alone.
  let root = null
  let primed = null
  let failed = false // the turn ended on an API error: recorded as such, not as a turn done
  let goingOn = false // the newest turn was sent on by the stop hook (Claude Code's stop_hook_active)
  const isRoot = (id) => {
    if (root === null && id) root = id
    return id === root
  }
  const start = () => (primed ??= hook("session-start", { source: "startup" }))
  return {
    event: async ({ event }) => {
      const props = event.properties || {}
      if (event.type === "session.created") {
        if (!props.info?.parentID && isRoot(props.sessionID)) start()
      } else if (event.type === "message.updated") {
        const info = props.info || {}
        if (info.role === "assistant" && info.time?.completed && info.tokens) {
          const record = { id: info.id, model: info.modelID, provider: info.providerID, tokens: info.tokens }
          try {
            appendFileSync(USAGE, JSON.stringify(record) + "\n")
          } catch {}
        }
      } else if (event.type === "session.status" && props.status?.type === "retry") {
        if (isRoot(props.sessionID)) touch(ACTIVITY)
      } else if (event.type === "session.error" && isRoot(props.sessionID)) {
        const error = props.error || {}
        const status = error.data?.statusCode
        failed = true
        await hook("stop-failure", {
          error: (error.name || "error") + (status ? ":" + status : ""),
          error_details: String(error.data?.message || ""),
        })
      } else if (event.type === "session.idle" && isRoot(props.sessionID)) {
        if (failed) {
          failed = false
          goingOn = false
          return
        }
        const reason = await hook("stop", { stop_hook_active: goingOn })
        goingOn = Boolean(reason)
        if (reason) {
          client.session
            .promptAsync({ path: { id: props.sessionID }, body: { parts: [{ type: "text", text: reason }] } })
            .catch(() => {})
        }
      }
    },
    "experimental.chat.system.transform": async (input, output) => {
      if (!isRoot(input.sessionID)) return
      const context = await start()
      if (context) output.system.push(context)
    },
    "tool.execute.after": async () => touch(ACTIVITY),
  }
}
