"""headcount as a gateway's endpoint picker: Envoy's ext_proc protocol (GIE's EPP protocol).

`server.py` serves it, `picker.py` answers one request's stream, `protocol.py`
reads and builds the messages.
"""

from headcount.gateway.server import PickerServer, build_picker, picker_credentials

__all__ = ["PickerServer", "build_picker", "picker_credentials"]
