from phoenix_chat.app.qt_compat import guard_singleton_refcounts

guard_singleton_refcounts()  # before any Qt call: see app/qt_compat.py
