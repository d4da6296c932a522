"""The Health tab's chart of norm and change by depth, as a widget that redraws to the width it gets."""

from __future__ import annotations

from inspector.health import HealthReport
from inspector.tui.widgets.auto_height import AutoHeightStatic
from inspector.tui.widgets.health_view import layer_chart, layer_rows


class LayerChart(AutoHeightStatic):
    """Norm and change by depth, redrawn to the width it gets."""

    DEFAULT_CSS = "LayerChart { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._report: HealthReport | None = None

    def show(self, report: HealthReport | None) -> None:
        self._report = report
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if self._report is None:
            self.update("")
            return
        width = max(self.content_region.width or self.size.width, 40)
        self.update(layer_chart(layer_rows(self._report.modules), width, self._report.against))
