"""TFLite files: `convert` makes them from traced signatures, `graph_passes` reads and rewrites
their flatbuffers, `quantize` quantizes them with ai-edge-quantizer."""
