"""Raw limits and the plain script, run in a process of their own: ``python -m bench.encode
SPEC.json``.

Raw limit: the model encodes exactly the chunks the pipeline produces, in the pipeline's order, in
one process, batch size as configured, nothing else running in the process; in up to three ways
(see ``raw_encode``), the fastest of which is the limit.

Plain script: parse with PyMuPDF, split with the same chunker, encode, add to Chroma; no state,
no queue, no retries: the ceiling a durable pipeline can approach. Model loading is outside every
timed window.

The spec names what to run; the answer is one JSON object on the last line of stdout.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path


def corpus_chunks(paths: list[Path], *, size: int, overlap: int) -> list[str]:
    """The chunks Sluice makes of these files: the pipeline's own parser and chunker, in order."""
    from sluice.pipeline.parsing.parse import PDF, open_document
    from sluice.pipeline.running.chunk import split_text

    out: list[str] = []
    for path in paths:
        doc = open_document(path, media_type=PDF, max_pages=100_000)
        try:
            for _, text in doc.pages():
                out.extend(split_text(text, size=size, overlap=overlap))
        finally:
            doc.close()
    return out


def raw_encode(embedder, batches: list[list[str]], *, mode: str) -> tuple[float, float]:
    """Wall and CPU seconds to encode every batch, in the pipeline's order.

    ``intraop``: one batch after the other, torch's intra-op threads (one per core) share each.
    ``lanes``: one thread per core takes the batches in turn, each encoding with one torch thread.
    ``packed``: as ``lanes``, through Sluice's embedder (each batch sorted by length and cut into
    parts that its lanes take), as the worker calls it.
    """
    import threading

    import torch

    model, cores = embedder.model, available_cores()
    torch.set_num_threads(cores if mode == "intraop" else 1)

    def run(mine: list[list[str]]) -> None:
        with torch.inference_mode():
            for batch in mine:
                if mode == "packed":
                    embedder.encode(batch)
                else:
                    model.encode(
                        batch,
                        batch_size=len(batch),
                        normalize_embeddings=True,
                        show_progress_bar=False,
                        convert_to_tensor=True,
                    )

    run(batches[:2])  # first calls set up the kernels
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "intraop":
        run(batches)
    else:
        threads = [threading.Thread(target=run, args=(batches[k::cores],)) for k in range(cores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return time.perf_counter() - t0, time.process_time() - c0


def plain_script(
    model, paths: list[Path], *, chroma_url: str, size: int, overlap: int, batch: int
) -> dict:
    """Parse, split, encode, add to Chroma: file by file, one add per file."""
    import chromadb
    import numpy as np
    import pymupdf
    from chromadb.config import Settings as ChromaSettings

    from sluice.pipeline.running.chunk import split_text

    host, port = chroma_url.rsplit("//", 1)[1].split(":")
    client = chromadb.HttpClient(
        host=host, port=int(port), settings=ChromaSettings(anonymized_telemetry=False)
    )
    name = f"plain-{uuid.uuid4().hex[:10]}"
    coll = client.create_collection(
        name, embedding_function=None, metadata={"hnsw:space": "cosine"}
    )
    chunks = 0
    t0 = time.perf_counter()
    for path in paths:
        texts, metas = [], []
        with pymupdf.open(path) as doc:
            for number, page in enumerate(doc, start=1):
                for piece in split_text(page.get_text(), size=size, overlap=overlap):
                    texts.append(piece)
                    metas.append({"file": path.name, "page": number})
        if not texts:
            continue
        vectors = model.encode(
            texts, batch_size=batch, normalize_embeddings=True, show_progress_bar=False
        )
        coll.add(
            ids=[f"{path.stem}-{i}" for i in range(len(texts))],
            embeddings=np.asarray(vectors, np.float32),
            documents=texts,
            metadatas=metas,
        )
        chunks += len(texts)
    seconds = time.perf_counter() - t0
    client.delete_collection(name)
    return {"seconds": seconds, "chunks": chunks}


def load_embedder(precision: str):
    from sluice.pipeline.running.embed import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder("all-MiniLM-L6-v2", precision=precision)


def available_cores() -> int:
    from sluice.pipeline.running.embed import available_cores as cores

    return cores()


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    paths = [Path(p) for p in spec["paths"]]
    size, overlap, batch = spec["chunk_size"], spec["chunk_overlap"], spec["batch"]
    chunks = corpus_chunks(paths, size=size, overlap=overlap)
    batches = [chunks[i : i + batch] for i in range(0, len(chunks), batch)]
    result: dict = {"chunks": len(chunks), "cores": available_cores()}
    for precision in spec["precisions"]:
        embedder = load_embedder(precision)
        for mode in spec["modes"]:
            seconds, cpu = raw_encode(embedder, batches, mode=mode)
            result[f"raw_{precision}_{mode}"] = {
                "seconds": seconds,
                "cpu_s": cpu,
                "chunks": len(chunks),
            }
        if precision in spec.get("plain", []):
            import torch

            torch.set_num_threads(available_cores())  # a plain script runs with torch's defaults
            result[f"plain_{precision}"] = plain_script(
                embedder.model,
                paths,
                chroma_url=spec["chroma_url"],
                size=size,
                overlap=overlap,
                batch=batch,
            )
        del embedder
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
