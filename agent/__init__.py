"""edgesdk.agent: the device daemon. Installs with ``pip install 'edgesdk[agent]'`` and never
imports converter dependencies (torch, onnx, coremltools, nncf)."""
