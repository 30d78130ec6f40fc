"""The device's pre- and post-processing steps for a bundle's signed pipeline
(``edgesdk.schemas.pipeline``): decode and pre-process an image into the model's input, and
turn its output into labels or a mask. numpy + Pillow, all in memory."""
