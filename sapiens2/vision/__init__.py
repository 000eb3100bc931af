"""The vision around the models: input hygiene (photos, video files, the limits an input may not pass),
resizing and normalization, the person detector, pose decoding and the dense maps mapped back onto a photo.

Imports `sapiens2.models` and the base modules (`errors`, `progress`, `data`)."""
