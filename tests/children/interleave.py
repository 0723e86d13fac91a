#!/usr/bin/env python3
"""Writes argv[1] numbered lines, alternating stdout and stderr, unbuffered: `line N`."""
import os
import sys

for i in range(int(sys.argv[1])):
    os.write(1 if i % 2 == 0 else 2, f"line {i}\n".encode())
