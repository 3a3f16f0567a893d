# One image for the four services (and the gt CLI). Credentials and configuration come from the
# environment at run time (docker-compose.yml, .env); nothing secret is baked in.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends tmux git \
    && rm -rf /var/lib/apt/lists/*

# Claude Code as a polecat runtime (`gt rig add ... --agent claude`), when built with its version
# (docker-compose.yml passes GT_CLAUDE_CODE_VERSION; ops/claude-code.version is the one the tests run). Its npm
# package installs a native executable: npm is needed for the install only, and removed after it.
ARG CLAUDE_CODE_VERSION=""
RUN if [ -n "$CLAUDE_CODE_VERSION" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends nodejs npm \
        && npm install --global --no-audit --no-fund --loglevel=error \
            "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" \
        && cp -L "$(npm root --global)/@anthropic-ai/claude-code/bin/claude.exe" /usr/local/bin/claude.native \
        && npm uninstall --global @anthropic-ai/claude-code \
        && mv /usr/local/bin/claude.native /usr/local/bin/claude \
        && apt-get purge -y --auto-remove nodejs npm \
        && rm -rf /var/lib/apt/lists/* /root/.npm \
        && claude --version; \
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
# The source revision the image was built from (docker-compose passes GT_REVISION, e.g. `git rev-parse HEAD`), in
# /etc/gastown-revision and as the standard label: last, so a rebuild for another revision of the same files redoes
# only this. The RUN comes first: podman's builder reuses a cached LABEL layer whatever the argument's value.
ARG GT_REVISION=""
RUN printf '%s\n' "$GT_REVISION" > /etc/gastown-revision
LABEL org.opencontainers.image.revision="$GT_REVISION"
USER gastown
CMD ["gt", "--help"]
