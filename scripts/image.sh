#!/usr/bin/env bash
# scripts/image.sh [ARCHIVE] — builds kpar's container image with buildah,
# without a Docker daemon and without pulling a base image, and writes it
# as an OCI archive to ARCHIVE (default kpar-oci.tar), which `podman load
# -i` and `docker load -i` accept (image name kpar:latest).
#
# The image: FROM scratch, holding
#   /kpar                                 the static binary (CGO_ENABLED=0, -trimpath),
#                                         the entrypoint
#   /etc/ssl/certs/ca-certificates.crt    this machine's CA bundle (--tls, https --url)
#   /etc/passwd, /etc/group               the user nonroot, 65532:65532, which it runs as
#   /tmp                                  mode 1777, empty
# and the OCI labels org.opencontainers.image.version, .revision and
# .source, which say what `kpar version` prints inside it. The Dockerfile
# builds the same layout for those with Docker; the test command builds
# this one (scripts/image-test.sh).
#
# VERSION (default: the tag `git describe` finds, else a Go pseudo-version
# of HEAD, v0.0.0-<commit time>-<12 hex>) and REVISION (default: HEAD's
# commit, +dirty when tracked files differ from it) override the stamps.
# buildah keeps its storage in a directory of its own, removed at exit
# (vfs driver, chroot isolation: this works as root in a container with no
# overlay mounts and no user namespaces). The image's creation time is
# HEAD's commit time, so that two builds of one commit are the same image.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archive=${1:-kpar-oci.tar}
case "$archive" in /*) ;; *) archive="$PWD/$archive" ;; esac

command -v buildah >/dev/null 2>&1 || {
  echo "image.sh: buildah is missing: apt-get install buildah (Debian), or build with the Dockerfile" >&2
  exit 1
}
ca=/etc/ssl/certs/ca-certificates.crt
[ -r "$ca" ] || { echo "image.sh: no CA bundle at $ca: apt-get install ca-certificates" >&2; exit 1; }

git=(git -C "$root")
if [ -z "${REVISION:-}" ]; then
  REVISION=$("${git[@]}" rev-parse HEAD)
  "${git[@]}" diff --quiet HEAD -- 2>/dev/null || REVISION="$REVISION+dirty"
fi
if [ -z "${VERSION:-}" ]; then
  VERSION=$("${git[@]}" describe --tags --match 'v[0-9]*' --exact-match 2>/dev/null || true)
  if [ -z "$VERSION" ]; then
    when=$(TZ=UTC "${git[@]}" log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)
    VERSION="v0.0.0-$when-$("${git[@]}" rev-parse --short=12 HEAD)"
  fi
fi
source_url=${SOURCE_URL:-https://github.com/kpar/kpar}

work=$(mktemp -d /tmp/kpar-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
ctx="$work/context"
mkdir -p "$ctx/etc/ssl/certs" "$ctx/tmp"
chmod 1777 "$ctx/tmp"

echo "image.sh: building kpar $VERSION ($REVISION)" >&2
(cd "$root/cmd/kpar" && CGO_ENABLED=0 go build -trimpath -buildvcs=false \
  -ldflags "-s -w -X main.version=$VERSION -X main.revision=$REVISION" -o "$ctx/kpar" .)
cp "$ca" "$ctx/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/etc/group"

cat >"$work/Containerfile" <<'EOF'
FROM scratch
COPY etc/ /etc/
COPY tmp/ /tmp/
COPY kpar /kpar
ARG VERSION
ARG REVISION
ARG SOURCE
LABEL org.opencontainers.image.title="kpar" \
      org.opencontainers.image.description="Parallel Kafka consumption: kpar forward POSTs every record to an HTTP endpoint" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
USER 65532:65532
# The status server's conventional port (--metrics-listen 0.0.0.0:9464).
EXPOSE 9464
ENTRYPOINT ["/kpar"]
CMD ["--help"]
EOF

bah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver "${STORAGE_DRIVER:-vfs}")
"${bah[@]}" bud --quiet --isolation chroot --format oci --timestamp "$("${git[@]}" log -1 --format=%ct HEAD)" \
  --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" --build-arg SOURCE="$source_url" \
  -f "$work/Containerfile" -t localhost/kpar:latest "$ctx" >/dev/null
rm -f "$archive"
"${bah[@]}" push --quiet localhost/kpar:latest "oci-archive:$archive:kpar:latest" >/dev/null
echo "image.sh: wrote $archive ($(du -k "$archive" | cut -f1) KiB; binary $(du -k "$ctx/kpar" | cut -f1) KiB): kpar $VERSION, revision $REVISION" >&2
