# pgfence command image.
#
#   docker build -t pgfence .
#   docker run --rm -e DATABASE_URL='postgres://app@db:5432/app' pgfence migrate up
#   docker run --rm -e DATABASE_URL=... pgfence demo worker    # what docker-compose.yml runs
#
# The binary is static (CGO_ENABLED=0) and embeds the migrations; the final
# image has a shell (Alpine by default) so that `docker run … --entrypoint
# sh` and `pgfence run -- sh -c …` work. `pgfence demo` without a database
# would need the PostgreSQL server binaries, which this image does not
# carry: give it DATABASE_URL.
#
# Build arguments (defaults: the upstream images and Go's own settings):
#   GO_IMAGE       the build stage's Go toolchain image   (golang:1.26)
#   RUNTIME_IMAGE  the final stage's base, with a shell   (alpine:3.22)
#   GOPROXY        the module proxy for the build stage   (the Go default)
# Where no registry can be reached, docker/build-images.sh builds stand-ins
# for both images (PGFENCE_GO_IMAGE, PGFENCE_RUNTIME_IMAGE), and GOPROXY can
# point at a proxy on this host (with --network host). The Dockerfile uses
# nothing that needs BuildKit, so the classic builder builds it too.

ARG GO_IMAGE=golang:1.26
ARG RUNTIME_IMAGE=alpine:3.22

FROM ${GO_IMAGE} AS build
ARG GOPROXY
WORKDIR /src
# Dependencies first, so that source edits reuse the module layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The command is a module of its own: build it against the library beside it
# (a workspace of the two; the repository's go.work names modules the image
# does not need).
RUN go work init . ./cmd/pgfence && \
    go work edit -replace github.com/pgfence/pgfence@v0.0.0-00010101000000-000000000000=. && \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags='-s -w' -o /out/pgfence ./cmd/pgfence

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/pgfence /usr/local/bin/pgfence
# A numeric user needs no account in the base image.
USER 10001:10001
ENTRYPOINT ["pgfence"]
CMD ["--help"]
