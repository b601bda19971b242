"""The retrieval node: Search over the plant's defect specs (FAISS + MiniLM), reloading new index versions."""
