"""The Responses API's stored responses: finished responses kept in memory, bounded, so that `previous_response_id`
can continue a conversation and `GET /v1/responses/{id}` return a response (`DELETE` forgets it). A restart forgets
them all, as a full store forgets its least recently used."""

from __future__ import annotations

import collections
import json
import threading

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .protocol import APIError
from .security import authorize

STORE_RESPONSES = 512  # responses kept
STORE_CHARACTERS = 64 * 1024 * 1024  # and at most this much JSON text


class ResponseStore:
    """Finished responses by id with the chat messages of their conversation, least recently used out first, bounded
    in count and in JSON characters. Thread-safe (the Ray replica and tests share one)."""

    def __init__(self, limit: int = STORE_RESPONSES, characters: int = STORE_CHARACTERS):
        self.limit, self.characters = limit, characters
        self._items: collections.OrderedDict[str, tuple[dict, list[dict], int]] = collections.OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def put(self, response: dict, messages: list[dict]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(messages))
        with self._lock:
            self._drop(response["id"])
            self._items[response["id"]] = (response, messages, size)
            self._size += size
            while self._items and (len(self._items) > self.limit or self._size > self.characters):
                self._drop(next(iter(self._items)))

    def get(self, rid: str) -> tuple[dict, list[dict]] | None:
        with self._lock:
            if rid not in self._items:
                return None
            self._items.move_to_end(rid)
            response, messages, _ = self._items[rid]
            return response, messages

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._drop(rid)

    def _drop(self, rid: str) -> bool:
        item = self._items.pop(rid, None)
        if item is not None:
            self._size -= item[2]
        return item is not None

    def __len__(self) -> int:
        return len(self._items)


def not_found(rid: str, param: str | None = None) -> APIError:
    return APIError(
        404 if param is None else 400,
        f"no stored response with id {rid!r} (responses are kept in memory, the last {STORE_RESPONSES} at most)",
        param=param,
        code="response_not_found",
    )


async def get_response(state, request: Request) -> Response:
    authorize(state.api_key, request)
    rid = request.path_params["response_id"]
    stored = state.responses.get(rid)
    if stored is None:
        raise not_found(rid)
    return JSONResponse(stored[0])


async def delete_response(state, request: Request) -> Response:
    authorize(state.api_key, request)
    rid = request.path_params["response_id"]
    if not state.responses.delete(rid):
        raise not_found(rid)
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})
