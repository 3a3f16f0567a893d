# One image for the four services (and the gt CLI). Credentials and configuration come from the
# environment at run time (docker-compose.yml, .env); nothing secret is baked in.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends tmux git \
    && rm -rf /var/lib/apt/lists/*

# The agent runtimes polecats run (`gt rig add ... --agent claude|codex|gemini|opencode`), each built in when its
# version is given (docker-compose.yml passes GT_CLAUDE_CODE_VERSION, GT_CODEX_VERSION, GT_GEMINI_CLI_VERSION and
# GT_OPENCODE_VERSION; ops/<name>.version are the ones the tests run); an empty version: without it. npm installs
# them and is removed after, with Debian's Node.js: Claude Code, Codex CLI and OpenCode are native executables from
# their npm platform packages, kept alone (Codex CLI with the resources beside its binary, OpenCode with its
# package's manifest, where the witness reads its version). Gemini CLI is a node program: it keeps its package and
# a Node.js of its own, NODE_VERSION from npm's node-linux-<arch> (it needs Node.js 20; Debian 12's is 18).
# Everything lands under /usr/local, readable and runnable by every user: the witness starts them as `agent`.
ARG CLAUDE_CODE_VERSION=""
ARG CODEX_VERSION=""
ARG GEMINI_CLI_VERSION=""
ARG OPENCODE_VERSION=""
ARG NODE_VERSION="20.20.2"
RUN set -eu; \
    packages=""; \
    [ -z "$CLAUDE_CODE_VERSION" ] || packages="$packages @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"; \
    [ -z "$CODEX_VERSION" ] || packages="$packages @openai/codex@$CODEX_VERSION"; \
    [ -z "$OPENCODE_VERSION" ] || packages="$packages opencode-ai@$OPENCODE_VERSION"; \
    if [ -n "$GEMINI_CLI_VERSION" ]; then \
        arch=$(dpkg --print-architecture); [ "$arch" != amd64 ] || arch=x64; \
        packages="$packages node-linux-$arch@$NODE_VERSION @google/gemini-cli@$GEMINI_CLI_VERSION"; \
    fi; \
    if [ -n "$packages" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends nodejs npm; \
        lib=$(npm root --global); \
        npm install --global --no-audit --no-fund --loglevel=error $packages; \
        if [ -n "$CLAUDE_CODE_VERSION" ]; then \
            cp -L "$lib/@anthropic-ai/claude-code/bin/claude.exe" /usr/local/bin/claude.native; \
            rm -rf "$lib/@anthropic-ai"; \
            mv -f /usr/local/bin/claude.native /usr/local/bin/claude; \
        fi; \
        if [ -n "$CODEX_VERSION" ]; then \
            vendor=$(dirname "$(find "$lib/@openai" -path '*/vendor/*/codex-package.json' | head -n 1)"); \
            mv "$vendor" /usr/local/lib/codex; \
            rm -rf "$lib/@openai"; \
            ln -sf /usr/local/lib/codex/bin/codex /usr/local/bin/codex; \
        fi; \
        if [ -n "$GEMINI_CLI_VERSION" ]; then \
            rm -rf "$lib"/node-linux-*/include "$lib"/node-linux-*/share "$lib"/node-linux-*/CHANGELOG.md; \
        fi; \
        if [ -n "$OPENCODE_VERSION" ]; then \
            rm -rf "$lib/opencode-ai/node_modules" "$lib/opencode-ai/postinstall.mjs"; \
        fi; \
        apt-get purge -y --auto-remove nodejs npm; \
        apt-get clean; \
        [ -z "$CLAUDE_CODE_VERSION" ] || claude --version; \
        [ -z "$CODEX_VERSION" ] || codex --version; \
        [ -z "$GEMINI_CLI_VERSION" ] || { node --version; gemini --version; }; \
        [ -z "$OPENCODE_VERSION" ] || opencode --version; \
        rm -rf /var/lib/apt/lists/* /root/.npm /root/.cache /root/.local /root/.config /root/.gemini /root/.codex; \
    fi

WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY gt ./gt
RUN pip install --no-cache-dir .

# An unprivileged user owns GT_HOME (rigs, worktrees, run files); a named volume mounted there starts as a
# copy of this directory, owner included.
RUN useradd --create-home --uid 10001 gastown \
    && mkdir -p /var/lib/gastown \
    && chown gastown:gastown /var/lib/gastown
ENV GT_HOME=/var/lib/gastown
VOLUME ["/var/lib/gastown"]

# Merge gates (code an agent wrote) run as `gate`, a user with no home, no password and no shell, that owns
# nothing of the town: the refinery container runs as root to start them as it (GT_GATE_USER=gate) and does
# nothing else as another user. Root's git may use repositories on the gt-home volume that `gastown` owns
# (git refuses another user's repository otherwise; see docs/deployment.md, "Gates").
RUN useradd --system --no-create-home --shell /usr/sbin/nologin --uid 10002 gate \
    && git config --global --add safe.directory '*'
# Agents (polecats) run as `agent`: the witness's container runs as root to start each agent as it
# (GT_AGENT_USER=agent) and hands it only its session's workspace, password file, runtime dir and publish folder;
# it owns nothing else of the town (docs/deployment.md, "Agents as another OS user").
RUN useradd --system --no-create-home --shell /bin/sh --uid 10003 agent
# The mayor agent (`gt mayor start`) runs as `mayor` (GT_TOWN_AGENT_USER=mayor): a user of its own, so no polecat can
# read its NATS credential or write its files (docs/mayor-agent.md).
RUN useradd --system --no-create-home --shell /bin/sh --uid 10004 mayor
# The source revision the image was built from (docker-compose passes GT_REVISION, e.g. `git rev-parse HEAD`), in
# /etc/gastown-revision and as the standard label: last, so a rebuild for another revision of the same files redoes
# only this. The RUN comes first: podman's builder reuses a cached LABEL layer whatever the argument's value.
ARG GT_REVISION=""
RUN printf '%s\n' "$GT_REVISION" > /etc/gastown-revision
LABEL org.opencontainers.image.revision="$GT_REVISION"
USER gastown
CMD ["gt", "--help"]
