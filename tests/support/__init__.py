"""What every test room shares, one of each: `hubproc` (a real `rsnotify hub` process), `cli`
(`rsnotify ...` in-process or as a subprocess), `subscribers` (a recording WebSub subscriber,
served in the test's loop or from a thread), `servers` (an aiohttp app served from a thread),
`clock` (time that moves when the test says), `jobs` (queued hub jobs run through their async
cores), `waiting` (bounded polls), `http` (one blocking request), `sources` (a Source's
discovery documents) and `ports` (`free_port`).

Test modules import these as `tests.support.<module>`; nothing here starts at import."""
