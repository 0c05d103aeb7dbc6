#!/usr/bin/env bash
# Builds, from Debian packages and from this repository, local stand-ins for
# the upstream images pgfence's Docker paths use, for machines whose Docker
# engine cannot pull them (no registry):
#
#   postgres  pgfence/postgres:<major>-<suite>  PostgreSQL 17 from Debian
#             trixie (the host's mirrors) with an entrypoint that honours
#             the upstream image's POSTGRES_* variables
#             (docker/postgres/docker-entrypoint.sh); stands in for
#             postgres:17 / postgres:17-alpine
#   migrate   pgfence/migrate:<version>          the golang-migrate CLI of the
#             version the migrations are tested with, built with Go (tags postgres, pgx5), on the
#             runtime image; stands in for migrate/migrate
#   golang    pgfence/golang:<go>-<suite>        the runtime stand-in below
#             with this machine's Go toolchain (static binaries: the
#             Dockerfile builds with CGO_ENABLED=0); stands in for
#             golang:1.26 as the Dockerfile's build stage
#   runtime   pgfence/busybox:<suite>            busybox and the CA
#             certificates; stands in for alpine:3.22 as the Dockerfile's
#             final stage
#
# The tags say what the images are; none is tagged with an upstream name.
# Every place that uses an upstream image takes it from a variable, so
# point those at the stand-ins: the script prints one NAME=tag line per
# image on stdout (progress goes to stderr), for example
#
#   eval "$(bash docker/build-images.sh | sed 's/^/export /')"
#
# sets PGFENCE_POSTGRES_IMAGE, PGFENCE_MIGRATE_IMAGE, PGFENCE_GO_IMAGE and
# PGFENCE_RUNTIME_IMAGE. Images are cached by tag: one whose label
# org.pgfence.recipe matches this script's recipe is not built again
# (--force rebuilds). The Debian mirror is the one this machine's apt uses,
# read from its sources at run time.
#
# Usage: docker/build-images.sh [--force] [postgres|migrate|golang|runtime]...
# Needs: root, docker, mmdebstrap (apt-get install mmdebstrap), go.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

force=false
wanted=()
for arg in "$@"; do
	case "$arg" in
	--force) force=true ;;
	postgres | migrate | golang | runtime) wanted+=("$arg") ;;
	*)
		echo "usage: $0 [--force] [postgres|migrate|golang|runtime]..." >&2
		exit 2
		;;
	esac
done
if [ ${#wanted[@]} -eq 0 ]; then wanted=(postgres migrate golang runtime); fi

log() { printf '%s\n' "build-images: $*" >&2; }
die() {
	log "$*"
	exit 1
}

for tool in docker mmdebstrap go; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found (mmdebstrap: apt-get install -y mmdebstrap)"
done
[ "$(id -u)" = 0 ] || die "run as root: mmdebstrap builds the root filesystems in root mode"

# Every temporary directory is made in one, removed however the script
# ends (a failed step's die, or .ci/run ending the script's group); a step
# that succeeds removes its own at once, to free the space.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The suite and the apt sources of this machine: the images are built from
# the same Debian release and mirror as the host's packages (the postgres
# image from another release, through the same mirrors: build_postgres).
# shellcheck disable=SC1091
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$suite" ] || die "cannot tell the Debian suite from /etc/os-release"
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
	[ -f "$f" ] || continue
	# Only entries for this suite, and only enabled ones.
	if grep -Eq "^[[:space:]]*(deb[[:space:]].*[[:space:]]$suite([[:space:]]|-)|Suites:.*\\b$suite\\b)" "$f" &&
		! grep -Eiq '^[[:space:]]*Enabled:[[:space:]]*no' "$f"; then
		sources+=("$f")
	fi
done
[ ${#sources[@]} -gt 0 ] || die "no apt sources for $suite under /etc/apt"
host_sources=("${sources[@]}")

# recipe identifies what an image is built from: this script, the
# entrypoint, and the inputs named in its arguments.
recipe() {
	{
		cat "$here/build-images.sh" "$here/postgres/docker-entrypoint.sh"
		printf '%s\n' "$@" "$suite"
		cat "${sources[@]}"
	} | sha256sum | cut -c1-16
}

# current VAR TAG RECIPE prints VAR=TAG and says whether the image exists
# with that recipe (then it need not be built).
current() {
	echo "$1=$2"
	if ! $force && [ "$(docker image inspect -f '{{index .Config.Labels "org.pgfence.recipe"}}' "$2" 2>/dev/null)" = "$3" ]; then
		log "$2: up to date"
		return 0
	fi
	return 1
}

# retire TAG OLD-ID: removes the image TAG named before a rebuild, unless
# something still uses it, so that rebuilds leave no dangling images.
retire() {
	local new
	new=$(docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true)
	if [ -n "$2" ] && [ "$2" != "$new" ]; then
		docker rmi "$2" >/dev/null 2>&1 || true
	fi
}

# image_id TAG: the image's ID, or nothing.
image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

# mmdebstrap_import TAG RECIPE MMDEBSTRAP-ARGS... -- DOCKERFILE-LINES...
# builds a root filesystem with mmdebstrap, imports it, and sets the
# image's configuration (ENV, ENTRYPOINT, …) with a Dockerfile on top:
# docker import --change does not take every instruction (STOPSIGNAL).
mmdebstrap_import() {
	local tag=$1 rcp=$2
	shift 2
	local mm=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		mm+=("$1")
		shift
	done
	shift
	local start=$SECONDS tmp old
	old=$(image_id "$tag")
	log "$tag: mmdebstrap ${mm[*]}"
	tmp=$(mktemp -d -p "$work")
	# A file rather than a pipe: a failed mmdebstrap must not import half a
	# root filesystem. --quiet hides apt's output, and with it why a run
	# failed; a mirror can fail a download now and then (seen: "E:
	# mmdebstrap failed to run" and nothing else), so a failed run is
	# tried once more with apt's output shown.
	local mmopts=(--aptopt='APT::Install-Recommends "false"'
		--customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*'
		"${mm[@]}" "$suite" "$tmp/rootfs.tar" "${sources[@]}")
	if ! mmdebstrap --quiet "${mmopts[@]}" >&2; then
		log "$tag: mmdebstrap failed; once more, with its output"
		rm -f "$tmp/rootfs.tar"
		mmdebstrap "${mmopts[@]}" >&2 || die "$tag: mmdebstrap failed twice"
	fi
	local rootfs="$tag-rootfs"
	docker import "$tmp/rootfs.tar" "$rootfs" >/dev/null
	rm -rf "$tmp"
	local ok=true
	printf '%s\n' "FROM $rootfs" "$@" "LABEL org.pgfence.recipe=$rcp" | docker build -q -t "$tag" - >/dev/null || ok=false
	docker rmi "$rootfs" >/dev/null # untags: the image keeps the layer
	$ok || die "$tag: docker build failed"
	retire "$tag" "$old"
	log "$tag: built in $((SECONDS - start))s"
}

# The PostgreSQL of the postgres image: the major the upstream images that
# pgfence's Docker paths name run (postgres:17, postgres:17-alpine), from the
# Debian release that ships it. The host's own PostgreSQL (15 on bookworm)
# serves the other tests, so CI covers both majors.
pg_major=17
pg_suite=trixie

build_postgres() {
	local major=$pg_major
	# mmdebstrap_import and recipe read suite and sources: here, the same
	# mirrors as the host's, for pg_suite instead of the host's suite.
	local host_suite=$suite suite=$pg_suite srcdir f
	local sources=()
	srcdir=$(mktemp -d -p "$work")
	for f in "${host_sources[@]}"; do
		sed -E "s/\b$host_suite\b/$suite/g" "$f" >"$srcdir/$(basename "$f")"
		sources+=("$srcdir/$(basename "$f")")
	done
	local tag="pgfence/postgres:$major-$suite" rcp
	rcp=$(recipe postgres "$major")
	if current PGFENCE_POSTGRES_IMAGE "$tag" "$rcp"; then
		rm -rf "$srcdir"
		return
	fi
	mmdebstrap_import "$tag" "$rcp" \
		--variant=minbase --include="postgresql-$major" \
		--customize-hook='rm -rf "$1"/etc/postgresql/* "$1"/var/lib/postgresql/*' \
		--customize-hook="copy-in $here/postgres/docker-entrypoint.sh /usr/local/bin" \
		--customize-hook='chmod 755 "$1"/usr/local/bin/docker-entrypoint.sh; mkdir -p "$1"/docker-entrypoint-initdb.d' \
		-- \
		"ENV PATH=/usr/lib/postgresql/$major/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		"ENV LANG=C.UTF-8" \
		"ENV PGDATA=/var/lib/postgresql/data" \
		"VOLUME /var/lib/postgresql/data" \
		"EXPOSE 5432" \
		"STOPSIGNAL SIGINT" \
		'ENTRYPOINT ["docker-entrypoint.sh"]' \
		'CMD ["postgres"]'
	rm -rf "$srcdir"
}

build_golang() {
	local goroot version
	goroot=$(go env GOROOT)
	version=$(go env GOVERSION)
	version=${version#go}
	local tag="pgfence/golang:$version-$suite" rcp
	rcp=$(recipe golang "$version")
	if current PGFENCE_GO_IMAGE "$tag" "$rcp"; then return; fi
	# The runtime stand-in's root filesystem and the toolchain, imported as
	# one layer: the toolchain's binaries are static and the build stage
	# runs only go and sh, so a Debian bootstrap of its own (with the
	# import of its tar, some 150 s of a cold CI run) buys nothing, and an
	# import writes the layer once where a Dockerfile's COPY and its steps
	# take some 40 s on a fuse-overlayfs engine.
	build_runtime >/dev/null
	local start=$SECONDS tmp old cid base ok=true
	old=$(image_id "$tag")
	tmp=$(mktemp -d -p "$work")
	log "$tag: $runtime_tag with $goroot"
	cid=$(docker create "$runtime_tag")
	docker export "$cid" | tar -x -C "$tmp" || ok=false
	docker rm "$cid" >/dev/null
	$ok || die "$tag: docker export of $runtime_tag failed"
	rm -f "$tmp/.dockerenv"
	mkdir -p "$tmp/go/bin" "$tmp/go/src"
	# The toolchain goes in under usr/local/go by renaming its members
	# (regular files and hard links; symbolic links keep their targets).
	base=$(basename "$goroot")
	tar -c -C "$tmp" . -C "$(dirname "$goroot")" --transform "s,^$base\(/\|\$\),usr/local/go\1,rhS" "$base" |
		docker import \
			--change "ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
			--change "ENV GOPATH=/go" \
			--change "ENV GOTOOLCHAIN=local" \
			--change "WORKDIR /go" \
			--change "LABEL org.pgfence.recipe=$rcp" \
			- "$tag" >/dev/null || ok=false
	rm -rf "$tmp"
	$ok || die "$tag: docker import failed"
	retire "$tag" "$old"
	log "$tag: built in $((SECONDS - start))s"
}

runtime_tag="pgfence/busybox:$suite"

build_runtime() {
	local rcp
	rcp=$(recipe runtime)
	if current PGFENCE_RUNTIME_IMAGE "$runtime_tag" "$rcp"; then return; fi
	# extract: these packages only, unpacked, no maintainer scripts, and
	# no customize phase: extract hooks do what the scripts would (the
	# shell's links, the CA bundle).
	mmdebstrap_import "$runtime_tag" "$rcp" \
		--variant=extract --include=busybox-static,ca-certificates \
		--extract-hook='for a in $(chroot "$1" /bin/busybox --list); do [ -e "$1/bin/$a" ] || ln -s busybox "$1/bin/$a"; done' \
		--extract-hook='mkdir -p "$1"/etc/ssl/certs "$1"/usr/local/bin "$1"/tmp "$1"/root && chmod 1777 "$1"/tmp' \
		--extract-hook='cat "$1"/usr/share/ca-certificates/*/*.crt >"$1"/etc/ssl/certs/ca-certificates.crt' \
		--extract-hook='printf "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n" >"$1"/etc/passwd' \
		--extract-hook='printf "root:x:0:\nnogroup:x:65534:\n" >"$1"/etc/group' \
		-- \
		"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		'CMD ["/bin/sh"]'
}

build_migrate() {
	local version
	# The release migrations/migrations_test.go tests the upstream CLI with
	# (UpstreamMigrateVersion): pgfence itself no longer imports golang-migrate.
	version=$(sed -n 's/^const UpstreamMigrateVersion = "\(.*\)"$/\1/p' "$root/migrations/migrations_test.go")
	[ -n "$version" ] || { echo "build-images: UpstreamMigrateVersion not found in migrations/migrations_test.go" >&2; return 1; }
	local tag="pgfence/migrate:$version" rcp
	rcp=$(recipe migrate "$version")
	if current PGFENCE_MIGRATE_IMAGE "$tag" "$rcp"; then return; fi
	build_runtime >/dev/null
	local start=$SECONDS tmp old
	old=$(image_id "$tag")
	tmp=$(mktemp -d -p "$work")
	log "$tag: go install github.com/golang-migrate/migrate/v4/cmd/migrate@$version"
	# migrations' TestUpstreamCLI builds the CLI with the same tags, cgo and
	# -trimpath, so that its compile comes from the build cache.
	if ! (cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -tags 'postgres pgx5' -trimpath \
		-ldflags="-s -w -X main.Version=$version" "github.com/golang-migrate/migrate/v4/cmd/migrate@$version" >&2); then
		die "$tag: go install failed"
	fi
	cat >"$tmp/Dockerfile" <<-EOF
		FROM $runtime_tag
		COPY migrate /usr/local/bin/migrate
		LABEL org.pgfence.recipe=$rcp
		ENTRYPOINT ["migrate"]
		CMD ["--help"]
	EOF
	if ! docker build -q -t "$tag" "$tmp" >/dev/null; then
		die "$tag: docker build failed"
	fi
	rm -rf "$tmp"
	retire "$tag" "$old"
	log "$tag: built in $((SECONDS - start))s"
}

for image in "${wanted[@]}"; do
	"build_$image"
done
