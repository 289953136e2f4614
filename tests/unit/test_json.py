from __future__ import annotations

import pytest

from ferryq import _json
from ferryq.errors import SerializationError


def test_text_keeps_every_character_as_it_is() -> None:
    assert _json.dumps(["é", "😀", {"k": 1.5}]) == '["é","😀",{"k":1.5}]'


@pytest.mark.parametrize("value", [["\ud800"], {"k": "a\udfffb"}, float("nan"), {1, 2}])
def test_what_no_database_can_store_is_refused_by_name(value: object) -> None:
    with pytest.raises(SerializationError, match="args"):
        _json.dumps(value, "args")
