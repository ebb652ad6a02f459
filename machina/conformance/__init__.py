"""machina's conformance kit: check a part against what the trainer relies on."""
