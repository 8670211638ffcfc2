# lockmq lock firmware (MicroPython). See firmware/README.md.
VERSION = "0.1.0"
