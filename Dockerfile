# pgwake: the `pgwake` command (worker, migrate, enqueue, stats, jobs, demo).
# Built by docker-compose.yml; usable on its own:
#   docker build -t pgwake . && docker run --rm pgwake help
FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/pgwake ./cmd/pgwake

# Alpine rather than scratch: exec handlers run under sh -c.
FROM alpine:3.20
# tini as PID 1: it reaps what exec handlers' commands leave behind (a
# process whose parent died), which pgwake as PID 1 would not.
RUN apk add --no-cache ca-certificates tzdata tini \
    && adduser -D -H -u 10001 pgwake
COPY --from=build /out/pgwake /usr/local/bin/pgwake
USER pgwake
# Metrics and health: pass --metrics-addr :9464 to listen beyond loopback.
EXPOSE 9464
ENTRYPOINT ["/sbin/tini", "--", "pgwake"]
CMD ["help"]
