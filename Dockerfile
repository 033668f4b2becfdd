# syntax=docker/dockerfile:1
# The kpar command as a container image: a static binary on distroless.
#
#   docker build -t kpar .
#   docker build --build-arg VERSION=v0.1.0 -t kpar:v0.1.0 .
#   docker run --rm kpar version
#
# The image runs as an unprivileged user and holds the binary, CA
# certificates and time zone data, nothing else (no shell). See
# docs/operations.md and deploy/kubernetes/.

# Build: the whole checkout, so that go.work joins the modules as in
# development (cmd/kpar requires the library at the next release's version,
# which go.work points at this checkout).
FROM golang:1.26 AS build
WORKDIR /src
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -X main.version=${VERSION}" -o /out/kpar ./cmd/kpar

# Run: distroless/static has CA certificates (for --tls and https --url),
# /etc/passwd with the nonroot user, and tzdata.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kpar /usr/local/bin/kpar
USER 65532:65532
# The status server's conventional port (--metrics-listen 0.0.0.0:9464).
EXPOSE 9464
ENTRYPOINT ["kpar"]
CMD ["--help"]
