# One image for the four services (and the gt CLI). Credentials and configuration come from the
# environment at run time (docker-compose.yml, .env); nothing secret is baked in.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends tmux git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN pip install --no-cache-dir .

# An unprivileged user owns GT_HOME (rigs, worktrees, run files); a named volume mounted there starts as a
# copy of this directory, owner included.
RUN useradd --create-home --uid 10001 gastown \
    && mkdir -p /var/lib/gastown \
    && chown gastown:gastown /var/lib/gastown
ENV GT_HOME=/var/lib/gastown
VOLUME ["/var/lib/gastown"]
USER gastown
CMD ["gt", "--help"]
