"""A fence for Redis: a fenced SET / DEL / PUBLISH done atomically on the server.

One Lua script (run with ``EVALSHA``; Redis runs a script atomically, nothing interleaves)
compares the token with the domain's mark and, only if it may write, advances the mark and
applies the effect in the same step::

    KEYS: the data key, the mark hash, the mark's operation list
    token <  mark.fence                       -> stale_fence (nothing changes)
    token == mark.fence, operation in list    -> duplicate
    expected_version given and != version     -> version_conflict
    else: mark.fence = token, version + 1, remember the operation; SET/DEL key or PUBLISH

The script is the enforcement point, so it checks every argument itself, as if this library did
not exist (a writer restricted to ``EVALSHA`` of it can still send anything): a token must be
``^[1-9][0-9]{0,18}$`` and at most int64 (``0041``, ``-42``, ``41.9``, ``4e10``, 23 digits are
``invalid``, nothing changes), and so must the operation id, expected version, action and keys.
Tokens are then compared as decimal strings (length, then bytes): exact for every int64, where
Lua's numbers (doubles) are exact only up to 2**53.  The mark is a hash ``format fence version
visible`` and a list of the newest operation ids; a mark key of another type, with fields this
script did not write or with a fence or version that is not one canonical int64 is refused
(``invalid_mark``) and nothing changes.  On Redis Cluster, put
the three keys in one slot with a hash tag (``{july}:result``, ``{july}:fence``).

Plain ``SET`` commands from other clients are not stopped (Redis has no triggers): restrict
writers with ACLs to ``EVALSHA`` of this script on the fenced keys (docs/fences.md).
The client is ``redis`` (``pip install 'fencedlease-client[redis]'``): :class:`RedisFence`
drives a ``redis.Redis``, :class:`AsyncRedisFence` a ``redis.asyncio.Redis``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11 on

from fencedlease.client.fences.core import (
    MARK_FORMAT,
    MAX_OPERATIONS,
    FenceInputError,
    FenceRequest,
    FenceResult,
    WriteOptions,
    check_name,
)
from fencedlease.client.results import Applied, Duplicate, Rejected, StaleFence, Unavailable

SCRIPT = """
-- The enforcement point checks its own inputs, as if no client library existed: a caller with
-- EVALSHA rights can send anything.  Tokens and versions have one text each (no sign, no
-- leading zero, no blank, no fraction, no exponent, at most int64), so comparing them as
-- digit strings (length, then bytes) is comparing the numbers, exactly above 2**53 too.
local MAX = '9223372036854775807'
local function number(s, zero)
  if type(s) ~= 'string' then return false end
  if s == '0' then return zero end
  if #s > 19 or not string.match(s, '^[1-9][0-9]*$') then return false end
  return #s < 19 or s <= MAX
end
local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local function invalid(why) return {'invalid', why, '0'} end
if #KEYS ~= 3 or #ARGV ~= 7 then return invalid('expected 3 keys and 7 arguments') end
if KEYS[3] ~= KEYS[2] .. ':ops' or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] then
  return invalid('the keys must be: the data key, the mark key, the mark key .. ":ops"')
end
local token, op, expected, strict = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local action, value = ARGV[5], ARGV[6]
if not number(token, false) then
  return invalid('the token is not a positive 64-bit integer written the one way '
    .. '(^[1-9][0-9]{0,18}$)')
end
if op ~= '' and (#op > 200 or not string.match(op, '^[!-~]+$')) then
  return invalid('the operation id is not 1-200 printable ASCII characters without spaces')
end
if expected ~= '' and not number(expected, true) then
  return invalid('the expected version is not a non-negative 64-bit integer')
end
if strict ~= '0' and strict ~= '1' then return invalid('strict is not 0 or 1') end
if action ~= 'set' and action ~= 'del' and action ~= 'publish' then
  return invalid('the action is not set, del or publish')
end
if (action == 'publish' and ARGV[7] ~= KEYS[1]) or (action ~= 'publish' and ARGV[7] ~= '') then
  return invalid('the channel must be the data key for publish, empty otherwise')
end
local mtype = redis.call('TYPE', KEYS[2])['ok']
local otype = redis.call('TYPE', KEYS[3])['ok']
if (mtype ~= 'none' and mtype ~= 'hash') or (otype ~= 'none' and otype ~= 'list') then
  return {'invalid_mark', 'the mark keys hold a ' .. mtype .. ' and a ' .. otype, '0'}
end
local fence, version = '0', '0'
if mtype == 'hash' then
  -- What is read back is checked like what is sent: a mark this script did not write (an
  -- unknown field, a fence '0041' or '-1' or 23 digits) is refused, never compared.
  for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
    if field ~= 'format' and field ~= 'fence' and field ~= 'version' and field ~= 'visible' then
      return {'invalid_mark', 'the mark hash was not written by the fence', '0'}
    end
  end
  local f = redis.call('HMGET', KEYS[2], 'format', 'fence', 'version')
  if f[1] ~= '@FORMAT@' or not number(f[2], true) or not number(f[3], true) then
    return {'invalid_mark', 'the mark hash was not written by the fence', '0'}
  end
  fence, version = f[2], f[3]
end
local c = cmp(token, fence)
if op ~= '' and c == 0 and redis.call('LPOS', KEYS[3], op) then
  return {'duplicate', version, fence}
end
if c < 0 or (strict == '1' and c == 0) then return {'stale_fence', version, fence} end
if expected ~= '' and expected ~= version then return {'version_conflict', version, fence} end
if version == MAX then return invalid('the version cannot grow any more') end
if c > 0 then redis.call('DEL', KEYS[3]) end
if op ~= '' then
  redis.call('LPUSH', KEYS[3], op)
  redis.call('LTRIM', KEYS[3], 0, @MAXOPS@ - 1)
end
redis.call('HINCRBY', KEYS[2], 'version', 1)
local v = redis.call('HGET', KEYS[2], 'version')  -- a string: exact (a Lua number is not)
redis.call('HSET', KEYS[2], 'format', '@FORMAT@', 'fence', token)
if action == 'set' then
  redis.call('SET', KEYS[1], value)
  redis.call('HSET', KEYS[2], 'visible', KEYS[1])
elseif action == 'del' then
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[2], 'visible')
else
  redis.call('PUBLISH', ARGV[7], value)
end
return {'applied', v, token}
""".replace("@FORMAT@", MARK_FORMAT).replace("@MAXOPS@", str(MAX_OPERATIONS))


@dataclass(frozen=True)
class RedisCall:
    """One script call: its keys and arguments (no I/O)."""

    keys: tuple[str, str, str]
    args: tuple[str | bytes, ...]
    request: FenceRequest
    where: str


def _call(
    mark_key: str,
    action: str,
    key: str,
    value: bytes | str | None,
    token: object,
    options: WriteOptions,
    channel: str = "",
) -> RedisCall:
    check_name(key, "key")
    if key in (mark_key, f"{mark_key}:ops"):
        raise FenceInputError(f"invalid key {key!r}: it is the fence's own mark key")
    if value is not None and not isinstance(value, (bytes, str)):
        raise TypeError(f"value must be bytes or str, not {type(value).__name__}")
    req = FenceRequest.checked(key, token, None if action == "del" else key, **options)
    args = (
        str(req.token),
        req.operation_id or "",
        "" if req.expected_version is None else str(req.expected_version),
        "1" if req.strict else "0",
        action,
        b"" if value is None else value,
        channel,
    )
    where = f"redis mark {mark_key}"
    return RedisCall((key, mark_key, f"{mark_key}:ops"), args, req, where)


def parse_reply(call: RedisCall, reply: Any) -> FenceResult:
    """The script's ``{code, version, fence}`` as a result."""
    try:
        code, version, fence = (x.decode() if isinstance(x, bytes) else str(x) for x in reply)
    except (TypeError, ValueError):
        return Rejected("invalid_reply", f"{call.where}: unexpected script reply {reply!r:.200}")
    req = call.request
    if code == "applied":
        return Applied(
            req.token,
            req.value,
            req.operation_id,
            version,
            f"applied: {call.keys[0]} written at fence {req.token} (version {version})",
        )
    if code == "duplicate":
        return Duplicate(
            req.token,
            req.operation_id,
            f"duplicate: operation {req.operation_id} was already applied to {call.where} "
            f"(accepted fence {fence})",
        )
    if code == "stale_fence":
        rule = "is not above" if fence == str(req.token) else "is below"
        return StaleFence(
            req.token, f"stale_fence: fence {req.token} {rule} the accepted fence {fence} "
            f"of {call.where}"
        )  # fmt: skip
    if code == "version_conflict":
        return Rejected(
            code,
            f"version_conflict: {call.where} is at version {version}, the write was prepared "
            f"against {req.expected_version}",
        )
    if code in ("invalid_mark", "invalid"):
        return Rejected(code, f"{code}: {call.where}: {version}; nothing changed")
    return Rejected("invalid_reply", f"{call.where}: unexpected script reply {reply!r:.200}")


R = TypeVar("R", FenceResult, Awaitable[FenceResult])


class _Base(Generic[R]):
    """The fenced operations, once: each builds its :class:`RedisCall` (pure) and hands it to
    the driver's :meth:`_run` (blocking in :class:`RedisFence`, awaitable in
    :class:`AsyncRedisFence`), the shape of ``client/publish.py``."""

    def __init__(self, client: Any, *, mark_key: str) -> None:
        self.client = client
        self.mark_key = check_name(mark_key, "mark key")
        self.script = client.register_script(SCRIPT)

    def set(
        self, key: str, value: bytes | str, token: object, **options: Unpack[WriteOptions]
    ) -> R:
        """``SET key value`` if ``token`` may write."""
        return self._run(_call(self.mark_key, "set", key, value, token, options))

    def delete(self, key: str, token: object, **options: Unpack[WriteOptions]) -> R:
        """``DEL key`` if ``token`` may write."""
        return self._run(_call(self.mark_key, "del", key, None, token, options))

    def publish(
        self, channel: str, message: bytes | str, token: object, *, operation_id: object = None
    ) -> R:
        """``PUBLISH channel message`` if ``token`` may write (the message is sent once per
        operation id: a retry is a ``Duplicate``)."""
        check_name(channel, "channel")
        once: WriteOptions = {"operation_id": operation_id}
        return self._run(_call(self.mark_key, "publish", channel, message, token, once, channel))

    def _run(self, call: RedisCall) -> R:
        raise NotImplementedError


def _failed(call: RedisCall, exc: Exception) -> Unavailable:
    return Unavailable(f"{call.where}: redis request failed: {exc}", 1)


class RedisFence(_Base[FenceResult]):
    """Fenced writes of one fencing domain (marked at ``mark_key``) on a ``redis.Redis``."""

    def _run(self, call: RedisCall) -> FenceResult:
        import redis

        try:
            reply = self.script(keys=list(call.keys), args=list(call.args))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return _failed(call, exc)
        return parse_reply(call, reply)


class AsyncRedisFence(_Base[Awaitable[FenceResult]]):
    """:class:`RedisFence` on a ``redis.asyncio.Redis`` (each operation is awaited)."""

    async def _run(self, call: RedisCall) -> FenceResult:
        import redis

        try:
            reply = await self.script(keys=list(call.keys), args=list(call.args))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return _failed(call, exc)
        return parse_reply(call, reply)
