# gpurouter: one static-ish binary (cgo on for go-nvml, which dlopens the
# host's libnvidia-ml.so.1 at run time; without it GPU telemetry is off).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Same build script as CI (.ci/run), so flags cannot drift.
RUN .ci/build /out/gpurouter

# glibc runtime (cgo, dlopen of NVML), no shell, non-root.
FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/gpurouter /usr/local/bin/gpurouter
COPY configs/gpurouter.example.yaml /etc/gpurouter/gpurouter.yaml
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gpurouter", "serve"]
CMD ["--config", "/etc/gpurouter/gpurouter.yaml"]
