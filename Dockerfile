# syntax=docker/dockerfile:1
# The kpar command as a container image, for those with Docker:
#
#   docker build -t kpar .
#   docker build --build-arg VERSION=v0.1.0 --build-arg REVISION=$(git rev-parse HEAD) -t kpar:v0.1.0 .
#   docker run --rm kpar version
#
# It builds the same layout as scripts/image.sh, which is what the test
# command builds and runs (with buildah, no Docker daemon and no base image
# pulled; scripts/image-test.sh): FROM scratch with /kpar as the
# entrypoint, the CA bundle at /etc/ssl/certs/ca-certificates.crt, the
# user nonroot (65532) in /etc/passwd, an empty /tmp, and the OCI labels
# version, revision and source that `kpar version` repeats. This file
# itself is not run by the tests. See docs/operations.md and deploy/.

# Build: the whole checkout, so that go.work joins the modules as in
# development (cmd/kpar requires the library at the next release's version,
# which go.work points at this checkout).
FROM golang:1.26 AS build
WORKDIR /src
COPY . .
ARG VERSION=(devel)
ARG REVISION=unknown
RUN --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    cd cmd/kpar && CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X 'main.version=${VERSION}' -X 'main.revision=${REVISION}'" -o /out/kpar .
RUN mkdir -p /out/etc/ssl/certs /out/tmp && chmod 1777 /out/tmp && \
    cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ && \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >/out/etc/passwd && \
    printf 'root:x:0:\nnonroot:x:65532:\n' >/out/etc/group

# Run: nothing but the binary, the CA bundle and the user.
FROM scratch
COPY --from=build /out/etc/ /etc/
COPY --from=build /out/tmp/ /tmp/
COPY --from=build /out/kpar /kpar
ARG VERSION=(devel)
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kpar" \
      org.opencontainers.image.description="Parallel Kafka consumption: kpar forward POSTs every record to an HTTP endpoint" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/kpar/kpar"
USER 65532:65532
# The status server's conventional port (--metrics-listen 0.0.0.0:9464).
EXPOSE 9464
ENTRYPOINT ["/kpar"]
CMD ["--help"]
