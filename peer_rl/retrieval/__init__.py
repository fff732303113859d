"""ESCRAG-R1 retrieval: the exemplar index (faiss) over ESC-Preference exemplars."""
