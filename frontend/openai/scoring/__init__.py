"""vLLM's score and rerank APIs (`/score`, `/v1/score`; `/rerank`, `/v1/rerank`, `/v2/rerank`) on
the embedding model: each text is embedded once and a pair scores the cosine of its two vectors,
as vLLM scores with an embedding (bi-encoder) model."""
