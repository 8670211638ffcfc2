# Replace a file so that a power cut leaves either the old or the new content.
# LittleFS (the ESP32 file system) and POSIX both rename atomically over an
# existing file; the data is flushed and the file closed before the rename.
import os


def write(path, data):
    tmp = path + ".new"
    f = open(tmp, "wb")
    try:
        f.write(data)
        f.flush()
    finally:
        f.close()
    try:
        os.rename(tmp, path)
    except OSError:
        # FAT cannot rename over a file: not atomic, but never reached on LittleFS.
        remove(path)
        os.rename(tmp, path)


def read(path):
    # The whole file, or None when it does not exist.
    try:
        f = open(path, "rb")
    except OSError:
        return None
    try:
        return f.read()
    finally:
        f.close()


def remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def size(path):
    try:
        return os.stat(path)[6]
    except OSError:
        return -1
