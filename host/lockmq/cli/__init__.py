"""The `lockmq` command line."""
def main(argv=None):
    print("lockmq")
