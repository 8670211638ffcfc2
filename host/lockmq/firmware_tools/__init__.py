"""Host tooling for the lock firmware: build a board's flash folder and LittleFS
image, flash it with esptool, deploy it with mpremote, watch a board's log.

The conventions (folder layout, config.json, log lines) are in firmware/README.md.
"""
