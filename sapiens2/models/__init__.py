"""The Sapiens2 model family in plain PyTorch: configs and presets, the kinds of official checkpoint, the
layers, backbone, heads and task models, their losses, weight loading, the device rules and the Hub.

Imports only `sapiens2.errors`, `sapiens2.progress` and `sapiens2.data`."""
