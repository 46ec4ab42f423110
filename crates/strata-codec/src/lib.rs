//! Page codecs (filled in by the network work).
