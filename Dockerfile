# pgfence command image.
#
#   docker build -t pgfence .
#   docker run --rm -e DATABASE_URL='postgres://app@db:5432/app' pgfence migrate up
#   docker run --rm -e DATABASE_URL=... pgfence demo worker    # what docker-compose.yml runs
#
# The binary is static (CGO_ENABLED=0) and embeds the migrations; the final
# image is Alpine so that `docker run … --entrypoint sh` and `pgfence run --
# sh -c …` have a shell. `pgfence demo` without a database would need the
# PostgreSQL server binaries, which this image does not carry: give it
# DATABASE_URL.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so that source edits reuse the module layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags='-s -w' -o /out/pgfence ./cmd/pgfence

FROM alpine:3.22
RUN adduser -D -H -u 10001 pgfence
COPY --from=build /out/pgfence /usr/local/bin/pgfence
USER pgfence
ENTRYPOINT ["pgfence"]
CMD ["--help"]
