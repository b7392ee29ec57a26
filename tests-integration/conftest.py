"""Full-stack tests on real models. See docs/testing.md for the torchvision note."""

import _torchvision_shim

_torchvision_shim.install()
