# The gateway image: every role of a CLUSTER deployment runs from it (docker-compose.yml):
#   gateway namesrv | gateway store ... | gateway start --mode cluster ...   (docs/cluster.md)
# Dependencies come from uv.lock (`uv sync --locked`), as `make install` does, without the dev group.
FROM python:3.11-slim-bookworm

ENV UV_VERSION=0.13.8 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    PYTHONUNBUFFERED=1 \
    PATH=/app/.venv/bin:$PATH

RUN pip install --no-cache-dir "uv==${UV_VERSION}"

WORKDIR /app
# Locked third-party dependencies first (a layer that survives source changes).
# (hatch_build.py: the build hook that compiles the optional hot path; this slim image has no C
# compiler, so it warns and installs pure Python, docs/store.md "Compiled hot path")
COPY pyproject.toml uv.lock README.md hatch_build.py ./
RUN uv sync --locked --no-dev --no-install-project

COPY gateway/ gateway/
COPY adapters/ adapters/
COPY cluster/ cluster/
COPY messaging_processor/ messaging_processor/
COPY namesrv/ namesrv/
COPY remoting/ remoting/
COPY runtime/ runtime/
COPY store/ store/
COPY analytics/ analytics/
COPY bridge/ bridge/
RUN uv sync --locked --no-dev

RUN useradd --system --uid 10001 --home-dir /app gateway && mkdir -p /data && chown gateway /data
USER gateway
VOLUME ["/data"]
# namesrv 9876, store node 10911, proxy: remoting 8080, gRPC 8081, HTTP 8082, MQTT 1883, AMQP 5672
EXPOSE 9876 10911 8080 8081 8082 1883 5672
ENTRYPOINT ["gateway"]
# Every interface, so authentication on (docs/security.md): the first admin's password is
# GATEWAY_ADMIN_PASSWORD, else written once to /data/initial-admin-password.
CMD ["start", "--host", "0.0.0.0", "--data-dir", "/data", "--auth"]
