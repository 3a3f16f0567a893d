# One image for the four services (and the gt CLI). Credentials and configuration come from the
# environment at run time; nothing secret is baked in.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends tmux git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN pip install --no-cache-dir .

ENV GT_HOME=/var/lib/gastown
VOLUME ["/var/lib/gastown"]
USER nobody
CMD ["gt", "--help"]
