"""The peers: LlamaIndex's IngestionPipeline and Haystack's indexing pipeline on the same corpus
and model, each in a process of its own.

    python -m bench.peer SPEC.json       (SPEC's "peer": "llama_index", the default, or "haystack")

Haystack (the ``peer-haystack`` extra) is built the way its documentation builds an indexing
pipeline: PyPDFToDocument -> DocumentSplitter -> SentenceTransformersDocumentEmbedder (the same
local model) -> DocumentWriter into the ChromaDocumentStore over HTTP; see ``run_haystack``.

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
    if spec.get("peer") == "haystack":
        print(json.dumps(run_haystack(spec)))
        return
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


# DocumentSplitter counts words: 125 words with 16 overlap make chunks of about Sluice's 800
# characters with 100 overlap on this corpus (the chunk counts are reported beside each other).
SPLIT_WORDS = 125
SPLIT_WORDS_OVERLAP = 16


def run_haystack(spec: dict) -> dict:
    """Haystack's documented indexing pipeline, per setup: ``fp32`` (batch ``spec["batch"]``, like
    Sluice) and ``default`` (the embedder's defaults: fp32, batch 32). Model loading (``warm_up``)
    is outside the timed window; recall through its ChromaEmbeddingRetriever afterwards."""
    from importlib.metadata import version

    from haystack import Pipeline
    from haystack.components.converters import PyPDFToDocument
    from haystack.components.preprocessors import DocumentSplitter
    from haystack.components.writers import DocumentWriter
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder,
    )
    from haystack_integrations.document_stores.chroma import ChromaDocumentStore

    from sluice.pipeline.running.embed import model_path

    host, port = spec["chroma_url"].rsplit("//", 1)[1].split(":")
    paths = [Path(p) for p in spec["paths"]]
    result: dict = {"haystack": version("haystack-ai")}
    for setup in spec["setups"]:
        store = ChromaDocumentStore(
            collection_name=f"haystack-{uuid.uuid4().hex[:10]}",
            host=host,
            port=int(port),
            distance_function="cosine",
        )
        embedder = SentenceTransformersDocumentEmbedder(
            model=model_path("all-MiniLM-L6-v2"),
            batch_size=spec["batch"] if setup == "fp32" else 32,
            progress_bar=False,
            local_files_only=True,
        )
        pipeline = Pipeline()
        pipeline.add_component("converter", PyPDFToDocument())
        pipeline.add_component(
            "splitter",
            DocumentSplitter(
                split_by="word", split_length=SPLIT_WORDS, split_overlap=SPLIT_WORDS_OVERLAP
            ),
        )
        pipeline.add_component("embedder", embedder)
        pipeline.add_component("writer", DocumentWriter(document_store=store))
        pipeline.connect("converter", "splitter")
        pipeline.connect("splitter", "embedder")
        pipeline.connect("embedder", "writer")
        embedder.warm_up()  # the model loads outside the timed window, as for the others
        t0 = time.perf_counter()
        out = pipeline.run({"converter": {"sources": paths}})
        seconds = time.perf_counter() - t0
        written = out["writer"]["documents_written"]
        row = {"seconds": seconds, "chunks": written, "stored": store.count_documents()}
        row["batch"] = embedder.batch_size
        if spec.get("facts"):
            row["ranks"] = _haystack_ranks(store, spec["facts"])
        result[setup] = row
    return result


def _haystack_ranks(store, facts: list[dict]) -> list[int | None]:
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersTextEmbedder,
    )
    from haystack_integrations.components.retrievers.chroma import ChromaEmbeddingRetriever

    from sluice.pipeline.running.embed import model_path

    text = SentenceTransformersTextEmbedder(
        model=model_path("all-MiniLM-L6-v2"), progress_bar=False, local_files_only=True
    )
    text.warm_up()
    retriever = ChromaEmbeddingRetriever(document_store=store, top_k=10)
    ranks = []
    for fact in facts:
        query = text.run(text=fact["query"])["embedding"]
        found = [d.content or "" for d in retriever.run(query_embedding=query)["documents"]]
        ranks.append(next((i for i, t in enumerate(found) if fact["name"] in t), None))
    return ranks


def _version() -> str:
    from importlib.metadata import version

    return version("llama-index-core")


if __name__ == "__main__":
    main(sys.argv[1])
