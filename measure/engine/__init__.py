"""The local measurement engine: build and measuring workers, their gate, the fastest builds kept."""
