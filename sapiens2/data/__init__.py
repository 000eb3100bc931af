"""Facts as data, and their reader: keypoint and body-part names, skeletons, flip pairs and palettes.

Imports only `sapiens2.errors`."""
