"""The peer: LlamaIndex's IngestionPipeline on the same corpus and model, in a process of its own.

    python -m bench.peer SPEC.json

Documents are built from PyMuPDF page text (LlamaIndex's file readers pin pandas below 3), one
Document per page with file name and page label as metadata, as its PDF reader does. The pipeline is
SentenceSplitter -> HuggingFaceEmbedding (the same local model) -> ChromaVectorStore over HTTP.
Setups: ``fp32`` (embed batch 32, like Sluice) and ``default`` (HuggingFaceEmbedding's defaults:
fp32, embed batch 10, torch's default threads). The splitter is sized to make chunks of Sluice's
size in both, so chunks/s compare like with like. Model loading is outside the timed window; recall
is measured afterwards through LlamaIndex's own retriever.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

# SentenceSplitter counts tokens (tiktoken); 180 tokens with 22 overlap make chunks of about the
# size of Sluice's 800 characters with 100 overlap on this corpus.
SPLIT_TOKENS = 180
SPLIT_OVERLAP = 22


def documents(paths: list[Path]):
    import pymupdf
    from llama_index.core import Document

    docs = []
    for path in paths:
        with pymupdf.open(path) as pdf:
            for number, page in enumerate(pdf, start=1):
                text = page.get_text()
                if text.strip():
                    docs.append(
                        Document(
                            text=text, metadata={"file_name": path.name, "page_label": str(number)}
                        )
                    )
    return docs


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import chromadb
    from chromadb.config import Settings as ChromaSettings
    from llama_index.core.constants import DEFAULT_EMBED_BATCH_SIZE
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from sluice.pipeline.running.embed import model_path

    # One model for both setups (loading it is outside the timed windows anyway); the default
    # setup is HuggingFaceEmbedding as constructed with nothing but the model.
    embed = HuggingFaceEmbedding(model_name=model_path("all-MiniLM-L6-v2"), device="cpu")
    paths = [Path(p) for p in spec["paths"]]
    # Warm up as the other contenders are warm: full-length texts through the batch sizes used.
    warm = [d.text for d in documents(paths[:3])][: spec["batch"]]
    for size in (spec["batch"], DEFAULT_EMBED_BATCH_SIZE):
        embed.embed_batch_size = size
        embed.get_text_embedding_batch(warm)
    host, port = spec["chroma_url"].rsplit("//", 1)[1].split(":")
    client = chromadb.HttpClient(
        host=host, port=int(port), settings=ChromaSettings(anonymized_telemetry=False)
    )
    result = {"llama_index": _version()}
    for setup in spec["setups"]:
        embed.embed_batch_size = spec["batch"] if setup == "fp32" else DEFAULT_EMBED_BATCH_SIZE
        result[setup] = run_setup(embed, client, paths, spec.get("facts") or [])
    print(json.dumps(result))


def run_setup(embed, client, paths: list[Path], facts: list[dict]) -> dict:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.vector_stores.chroma import ChromaVectorStore

    name = f"llama-{uuid.uuid4().hex[:10]}"
    coll = client.create_collection(
        name, embedding_function=None, metadata={"hnsw:space": "cosine"}
    )
    store = ChromaVectorStore(chroma_collection=coll)
    pipeline = IngestionPipeline(
        transformations=[
            SentenceSplitter(chunk_size=SPLIT_TOKENS, chunk_overlap=SPLIT_OVERLAP),
            embed,
        ],
        vector_store=store,
    )
    t0 = time.perf_counter()
    nodes = pipeline.run(documents=documents(paths))
    seconds = time.perf_counter() - t0
    out = {
        "seconds": seconds,
        "chunks": len(nodes),
        "stored": coll.count(),
        "batch": embed.embed_batch_size,
    }
    if facts:
        retriever = VectorStoreIndex.from_vector_store(store, embed_model=embed).as_retriever(
            similarity_top_k=10
        )
        ranks = []
        for fact in facts:
            texts = [n.node.get_content() for n in retriever.retrieve(fact["query"])]
            ranks.append(next((i for i, t in enumerate(texts) if fact["name"] in t), None))
        out["ranks"] = ranks
    client.delete_collection(name)
    return out


def _version() -> str:
    from importlib.metadata import version

    return version("llama-index-core")


if __name__ == "__main__":
    main(sys.argv[1])
