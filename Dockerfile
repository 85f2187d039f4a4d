# Tessera's image: the `coordinator`, `worker` and `tessera` binaries with
# the shared libraries they link, on an empty base. No image is pulled, so
# it builds on a machine without registry access and everywhere else alike.
#
# `scripts/docker-build.sh` builds the binaries and stages them with their
# libraries (found by ldd) and onnxruntime's (from its wheel) in
# docker/rootfs/, then runs `docker compose build`. See README.md ("A
# cluster in containers").
FROM scratch
COPY docker/rootfs/ /
ENV PATH=/usr/local/bin \
    ORT_DYLIB_PATH=/usr/local/lib/tessera/libonnxruntime.so.1.32.0 \
    RUST_LOG=info \
    TESSERA_CERTS=/certs
WORKDIR /
CMD ["tessera", "--help"]
