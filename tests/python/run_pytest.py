#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs pytest on the files given, for meson: exits 77 (skipped) with a message
# when torch or pytest is not installed, and keeps pytest's cache out of the
# source tree.
import sys

try:
    import torch  # noqa: F401
    import pytest
except ImportError as e:
    print(f"skipped: {e} (python3-torch and python3-pytest are needed)")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-rs", "--durations=0", "-p", "no:cacheprovider"] + sys.argv[1:]))
