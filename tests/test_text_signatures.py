"""Text whose first bytes match another format's signature ("BMI-1...", "MZ...") is text when its
name or declared type says text and its bytes decode as text; a real file of that format is still
refused, whatever its name."""

from __future__ import annotations

import httpx
import pytest

from sluice.errors import UserActionError
from sluice.pipeline.parsing.parse import MARKDOWN, TEXT, sniff_type
from tests.support.api_server import auth, make_key

# Text that filetype reads as another format by its first bytes (the list).
LOOKALIKES = [
    b"BMI-1 and BMAL1 regulate the circadian clock of stem cells.\n",
    b"MZ is the code of the Mozambique metical in ISO 4217.\n",
    b"ID3 tags are read by every music player.\n",
    b"%!PS is how a PostScript program begins, said the manual.\n",
    b"GIF89a was the year's format, the talk began.\n",
    b"OggS pages carry Vorbis audio, the notes say.\n",
    b"fLaC streams are lossless, the reviewer wrote.\n",
    b"8BPS is Photoshop's signature, the forensic report noted.\n",
]


@pytest.mark.parametrize("head", LOOKALIKES, ids=lambda h: h[:4].decode())
def test_text_named_as_text_is_text_whatever_its_first_bytes(head):
    assert sniff_type(head, "abstract.txt") == TEXT
    assert sniff_type(head, "notes.md") == MARKDOWN
    assert sniff_type(head, "abstract") == TEXT  # no suffix: nothing says otherwise
    assert sniff_type(head, "upload.bin", declared="text/plain") == TEXT


def test_a_signature_wins_where_the_name_does_not_say_text():
    with pytest.raises(UserActionError, match="image/bmp"):
        sniff_type(LOOKALIKES[0], "scan.bmp")
    with pytest.raises(UserActionError, match="application/postscript"):
        sniff_type(LOOKALIKES[3], "figure.ps")


def test_a_real_file_of_another_format_is_refused_even_named_as_text():
    bmp = b"BM" + (70).to_bytes(4, "little") + b"\x00" * 4 + (54).to_bytes(4, "little") + b"\0" * 56
    exe = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff" + b"\x00" * 64
    for data, mime in ((bmp, "image/bmp"), (exe, "application/x-msdownload")):
        with pytest.raises(UserActionError, match=mime):
            sniff_type(data, "notes.txt", declared="text/plain")


def test_the_api_takes_lookalike_text_as_a_file_and_as_json(api_process):
    token = make_key("app", datasets=None, scope="ingest")
    c = httpx.Client(base_url=api_process.url, headers=auth(token), timeout=30)
    url = "/v1/datasets/default/documents"
    r = c.post(url, files={"file": ("bmi.txt", LOOKALIKES[0], "application/octet-stream")})
    assert r.status_code == 202, r.text
    # a JSON upload is text by what it is, even under a name that says nothing
    r = c.post(url, json={"filename": "metical", "text": LOOKALIKES[1].decode()})
    assert r.status_code == 202, r.text
    r = c.post(url, json={"filename": "tags.dat", "text": LOOKALIKES[2].decode()})
    assert r.status_code == 202, r.text
    # a multipart part declared as text under another name is text too
    r = c.post(url, files={"file": ("flac.dat", LOOKALIKES[6], "text/plain")})
    assert r.status_code == 202, r.text
    # the same bytes declared as nothing, under a name that is not text: the signature stands
    r = c.post(url, files={"file": ("clip.dat", LOOKALIKES[5], "application/octet-stream")})
    assert r.status_code == 415 and r.json()["code"] == "unsupported_type", r.text
