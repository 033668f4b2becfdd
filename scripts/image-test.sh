#!/usr/bin/env bash
# scripts/image-test.sh — builds kpar's image with scripts/image.sh and runs
# it as a container would run, with `buildah run --isolation chroot
# --network host` (no Docker daemon needed), checking:
#   - podman load accepts the archive (when podman is installed);
#   - the layout: /kpar as the entrypoint, user 65532 with an /etc/passwd
#     entry, the CA bundle, the OCI labels equal to `kpar version` inside;
#   - `kpar demo` inside the image: nothing lost, no violation;
#   - `kpar forward` inside the image against a `kpar broker` and an HTTP
#     endpoint on the host: every record produced (kcat) is delivered, the
#     process runs as 65532, and a SIGTERM stops it with exit 0 after its
#     final commit.
# scripts/test.sh runs it. Without buildah or kcat it skips, except under
# CI=true, where it fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

missing=()
for tool in buildah kcat python3; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${CI:-}" = true ]; then
    echo "image-test.sh: FAIL: ${missing[*]} missing (scripts/test.sh installs them)" >&2
    exit 1
  fi
  echo "image-test.sh: skipped: ${missing[*]} missing" >&2
  exit 0
fi

work=$(mktemp -d /tmp/kpar-image-test.XXXXXX)
pids=()
bah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver "${STORAGE_DRIVER:-vfs}")
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # vfs layers are plain directories, but keep a failed umount from
  # leaving anything mounted under $work.
  "${bah[@]}" umount --all >/dev/null 2>&1 || true
  "${bah[@]}" rm --all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
passed=0 # checks passed
fail() {
  echo "image-test.sh: FAIL: $*" >&2
  for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
  exit 1
}
pass() { passed=$((passed + 1)); echo "image-test.sh: ok: $*"; }
# await COND_CMD... : runs the condition every 0.2s, for at most 60s.
await() {
  local deadline=$((SECONDS + 60))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

# The image, as the README says to build it.
scripts/image.sh "$work/kpar-oci.tar"
pass "scripts/image.sh wrote an OCI archive of $(du -k "$work/kpar-oci.tar" | cut -f1) KiB"
if command -v podman >/dev/null 2>&1; then
  podman --root "$work/podman" --runroot "$work/podman-run" --storage-driver vfs load -q -i "$work/kpar-oci.tar" >"$work/podman.log" 2>&1 ||
    fail "podman load refused the archive"
  pass "podman load took the archive: $(tail -1 "$work/podman.log")"
fi
ctr=$("${bah[@]}" from --quiet --pull-never "oci-archive:$work/kpar-oci.tar")
run_in() { "${bah[@]}" run --isolation chroot --network host "$ctr" -- "$@"; }

# Layout and labels.
inspect() { "${bah[@]}" inspect --type container --format "$1" "$ctr"; }
[ "$(inspect '{{.OCIv1.Config.User}}')" = 65532:65532 ] || fail "user is $(inspect '{{.OCIv1.Config.User}}'), want 65532:65532"
[ "$(inspect '{{.OCIv1.Config.Entrypoint}}')" = "[/kpar]" ] || fail "entrypoint is $(inspect '{{.OCIv1.Config.Entrypoint}}'), want [/kpar]"
mnt=$("${bah[@]}" mount "$ctr")
grep -q '^nonroot:x:65532:65532:' "$mnt/etc/passwd" || fail "/etc/passwd has no entry for 65532"
cmp -s "$mnt/etc/ssl/certs/ca-certificates.crt" /etc/ssl/certs/ca-certificates.crt || fail "no CA bundle at /etc/ssl/certs/ca-certificates.crt"
files=$(cd "$mnt" && find . -type f | sort | tr '\n' ' ')
[ "$files" = "./etc/group ./etc/passwd ./etc/ssl/certs/ca-certificates.crt ./kpar " ] || fail "unexpected files in the image: $files"
# The host's broker runs the image's own binary (static: it runs here too).
cp "$mnt/kpar" "$work/kpar"
"${bah[@]}" umount "$ctr" >/dev/null
version_out=$(run_in /kpar version)
echo "$version_out" | sed 's/^/  in image: /'
v=$(echo "$version_out" | sed -n '1s/^kpar //p')
r=$(echo "$version_out" | sed -n 's/^revision: //p')
label() { inspect "{{index .OCIv1.Config.Labels \"org.opencontainers.image.$1\"}}"; }
[ "$(label version)" = "$v" ] || fail "label version $(label version) != kpar version's $v"
[ "$(label revision)" = "$r" ] || fail "label revision $(label revision) != kpar version's $r"
[ -n "$(label source)" ] || fail "no org.opencontainers.image.source label"
[ "$r" = "$(git rev-parse HEAD)" ] || [ "$r" = "$(git rev-parse HEAD)+dirty" ] || fail "revision $r is not HEAD"
pass "layout: /kpar as 65532 with a passwd entry, CA bundle, labels version=$v revision=$r"

# kpar demo inside the image.
demo=$(run_in /kpar demo --records 5000 --json 2>"$work/demo.log") || fail "kpar demo in the image exited $?"
echo "  in image: kpar demo --records 5000 --json: $demo"
case "$demo" in *'"produced":5000,"handled":5000,"duplicates":0,"lost":0,"order_violations":0,"commit_violations":0'*) ;; *) fail "kpar demo: $demo" ;; esac
pass "kpar demo in the image: 5000 records, none lost, no violation"

# kpar forward inside the image, against a broker and an endpoint on the host.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
bport=$(free_port)
"$work/kpar" broker --listen "127.0.0.1:$bport" --partitions 4 >"$work/broker.log" 2>&1 &
pids+=($!)
await grep -qs listening "$work/broker.log" || fail "kpar broker did not start"
cat >"$work/endpoint.py" <<'EOF'
# Counts the records POSTed to it (one a request) and writes the count to
# the file given; answers 204. Prints its port once listening.
import http.server, os, sys, threading
count, lock, out = 0, threading.Lock(), sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        global count
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            count += 1
            with open(out + ".tmp", "w") as f: f.write(str(count))
            os.replace(out + ".tmp", out)  # never read half-written
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
EOF
python3 "$work/endpoint.py" "$work/delivered" >"$work/endpoint.port" 2>"$work/endpoint.log" &
pids+=($!)
await test -s "$work/endpoint.port" || fail "the endpoint did not start"
eport=$(cat "$work/endpoint.port")
records=500
seq 1 $records | sed 's/^/key-/;s/$/:{"n":1}/' | kcat -P -b "127.0.0.1:$bport" -t orders -K: || fail "kcat could not produce"
mport=$(free_port)
"${bah[@]}" run --isolation chroot --network host "$ctr" -- /kpar forward \
  --brokers "127.0.0.1:$bport" --group image-test --topic orders \
  --url "http://127.0.0.1:$eport/orders" --content-type application/json \
  --concurrency 16 --metrics-listen "127.0.0.1:$mport" >"$work/forward.log" 2>&1 &
fwd=$!
pids+=($fwd)
delivered() { [ "$(cat "$work/delivered" 2>/dev/null || echo 0)" -ge $records ]; }
await delivered || fail "kpar forward in the image delivered $(cat "$work/delivered" 2>/dev/null || echo 0) of $records records"
# buildah run answers a SIGTERM by killing the container's process: signal
# kpar itself, as the kubelet would (the one process named kpar below it).
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
kpid=
for p in $(descendants "$fwd"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = kpar ] && kpid=$p; done
[ -n "$kpid" ] || fail "no kpar process under buildah run"
uid=$(awk '/^Uid:/ {print $2}' "/proc/$kpid/status")
[ "$uid" = 65532 ] || fail "kpar forward runs as uid $uid, want 65532"
ready=$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$mport/readyz', timeout=10).status)" 2>/dev/null || true)
kill -TERM "$kpid"
rc=0
wait "$fwd" || rc=$?
sed 's/^/  in image: /' "$work/forward.log"
[ $rc = 0 ] || fail "kpar forward exited $rc after SIGTERM, want 0"
grep -q 'kpar forward stopped: in-flight records finished and offsets committed' "$work/forward.log" || fail "no final commit in the log"
[ "$ready" = 200 ] || fail "/readyz answered $ready, want 200"
pass "kpar forward in the image: $(cat "$work/delivered") of $records records delivered, ran as 65532, /readyz 200, SIGTERM exit 0"
echo "image-test.sh: all $passed checks passed"
