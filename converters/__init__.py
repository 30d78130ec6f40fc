"""edgesdk.converters: the host toolchain that turns PyTorch or ONNX models into device artifacts."""
