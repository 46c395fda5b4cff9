def main() -> None:  # placeholder until the backend lands
    raise SystemExit("fusion_backend: not built yet")
