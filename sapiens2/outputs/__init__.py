"""What a result becomes: pictures (uint8 RGB), export files (JSON, PNG, .npy, .ply) and `TaskResult`.

Imports `sapiens2.vision`, `sapiens2.models` and the base modules."""
