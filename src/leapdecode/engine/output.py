"""The output processor: turns each request's accepted tokens into what its caller sees (new text, stop decisions,
the finish reason and the final stats), apart from the model's forward.

Text is detokenized incrementally (text.TextStream). A stop string completed by a token of this step ends the
request at that token: the tokens after it are dropped from the output, as plain decoding cut at the stop string
would give.
"""

from __future__ import annotations

from ..params import finish_reason
from ..stats import GenerationStats
from .executor import Accepted
from .request import RequestOutput


def request_output(accepted: Accepted) -> RequestOutput:
    request, seq, new = accepted.request, accepted.request.seq, accepted.new
    used = request.text.push(new)
    if request.text.stopped:  # a stop string ended the request at this step's token number `used`
        new = seq.end_at_stop_string(new, used)
    finished = seq.finished
    first = seq.stats.forward_passes == 1  # the step that read the prompt's end
    stop_reason = None
    if finished and seq.stats.stop_reason == "stop":  # a stop string, else a stop token id (not the end of sequence)
        stop_reason = request.text.stopped_by if request.text.stopped else seq.out[-1]
    return RequestOutput(
        request.id,
        new,
        request.text.release(final=finished),
        finished,
        finish_reason(seq.stats.stop_reason) if finished else None,
        len(request.prompt_ids),
        seq.finish() if finished else None,
        logprobs=None if seq.num_logprobs is None else seq.logprobs[len(seq.out) - len(new) :],
        prompt_logprobs=[None, *request.prompt_scores]
        if first and request.params.prompt_logprobs is not None
        else None,
        stop_reason=stop_reason,
    )


def cancelled_output(request) -> RequestOutput:
    return RequestOutput(
        request.id, [], "", True, finish_reason("cancelled"), len(request.prompt_ids), _closed(request)
    )


def failed_output(request, error: str) -> RequestOutput:
    """The last output of a request whose step failed: what it had released stays released; no more text."""
    return RequestOutput(
        request.id, [], "", True, finish_reason("error"), len(request.prompt_ids), _closed(request, "error"), error
    )


def _closed(request, reason: str = "cancelled") -> GenerationStats:
    if request.seq is not None:
        return request.seq.finish(reason)
    return GenerationStats(prompt_tokens=len(request.prompt_ids), stop_reason=reason)
